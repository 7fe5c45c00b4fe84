"""Which of a paper's claims this run supports: each claim a paired comparison over seeds in
the cells where the paper makes it, one verdict per claim with its reason, the cells as evidence.

A study registers its paper's claims (`Claim`: id, paper section, the claim in our words, the
compared arms, the metric, a direction or an equivalence margin, the smallest effect that
matters, how its cells combine, the minimum evidence) and a function that reads its runs into
observations: one row per claim, cell (the compared runs' shared wildcards) and seed, with the
arm's and the baseline's values and runs (`OBSERVATION_COLUMNS`). A pair whose `scale` names a
reason (e.g. neither arm learned) is dropped and counted. `evaluate` gives one row per claim and
cell (`COLUMNS`):

- `diff_mean`, `diff_ci_low`, `diff_ci_high`: the mean over seeds of arm − baseline and its
  95 % Student-t interval (`dpmed.report.intervals.t_interval`);
- `p`: for a direction, the two-sided paired t-test; for an equivalence within ±margin, the
  two one-sided tests (TOST, the larger one-sided p) and `p_outside`, the test of |difference|
  > margin (twice the smaller one-sided p); `p_holm`, `p_outside_holm`: Holm's step-down
  correction over the claim's deciding cells (`decides`) — one family per claim, so a claim's
  verdict is wrong with probability at most `ALPHA` whatever the other claims;
- `verdict`: `supported` (Holm p < `ALPHA` in the claimed direction with |mean| at least the
  claim's smallest effect, or equivalence shown), `contradicted` (Holm p < `ALPHA` the other
  way, or Holm p_outside < `ALPHA`), else `inconclusive` with its reason.

`claim_verdicts` combines each claim's deciding cells as the claim says (`every` cell,
`any` cell, or its `primary` cells): the table the report shows first.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import PurePath
from typing import Literal

import numpy as np
import pandas as pd
from scipy.special import stdtr

from dpmed.registry import resolve
from dpmed.report.intervals import MIN_SEEDS, t_interval
from dpmed.report.outputs import LINK_SEPARATOR

ALPHA = 0.05
Test = Literal["greater", "less", "equivalent"]
Combine = Literal["every", "any", "primary"]
Group = Literal["paper", "beyond"]
GROUP_LABELS = {"paper": "the paper's claims", "beyond": "beyond the paper (prior work or ours)"}
RUNS_SEPARATOR = ";"  # between the run folders of a pair side that pools several runs
OBSERVATION_COLUMNS = [
    "claim", "cell", "seed", "arm", "baseline", "scale", "arm_run", "baseline_run",
]  # fmt: skip
# What a reader needs first (claim, cell, verdict, reason), then the test behind the verdict.
COLUMNS = [
    "claim", "cell", "verdict", "reason", "decides", "study", "group", "paper", "statement",
    "metric", "comparison", "test", "margin", "smallest_effect", "n_seeds", "dropped",
    "min_seeds", "arm_mean", "baseline_mean", "diff_mean", "diff_ci_low", "diff_ci_high", "p",
    "p_holm", "p_outside", "p_outside_holm", "evidence",
]  # fmt: skip
# One row per claim: the answer, then the cell that decided it.
CLAIM_COLUMNS = [
    "claim", "verdict", "reason", "study", "group", "paper", "statement", "metric", "comparison",
    "test", "combine", "cells", "supported_cells", "contradicted_cells", "weakest_cell",
    "effect", "effect_low", "effect_high", "smallest_effect", "margin", "basis", "n_seeds",
    "evidence",
]  # fmt: skip
VERDICTS = ("supported", "contradicted", "inconclusive")


@dataclass(frozen=True)
class Claim:
    """One claim of a paper as a paired comparison of `arm` against `baseline` over seeds.

    Args:
        id: stable identifier, `<study>-<what>`.
        paper: where the paper makes it (`paper 002 §5.1`).
        statement: the claim in our words.
        metric: what is compared, with its unit (`test Dice`).
        arm: the compared cells, in words (`NSGD`).
        baseline: the cells it is compared with (`flat clipping`).
        test: `greater` / `less` (arm − baseline > 0 / < 0) or `equivalent` (|arm − baseline|
            < margin).
        needs: the grid cells the comparison reads, for the reason when they are absent.
        evidence: the report tables and figures that show the compared values, as file-name
            stems (no folder or extension) that may hold the cell's wildcards (`{dataset}`)
            and glob characters (`seg_fig?_{dataset}`); `evidence_files` resolves them.
        margin: the equivalence margin, in the metric's unit (`equivalent` only).
        smallest_effect: the smallest |arm − baseline| that matters (direction claims, metric
            unit): a mean difference below it is never `supported`.
        basis: where the margin or smallest effect comes from (the paper's numbers).
        combine: how the deciding cells give the claim's verdict: `every` (supported when every
            cell is, contradicted when one is), `any` (supported when one is, contradicted when
            every one is), `primary` (as `every`, over the cells matching `primary` only).
        primary: fnmatch pattern of the deciding cells' labels (`combine="primary"`).
        group: `paper` (a finding of the paper) or `beyond` (prior work, or our comparison).
        min_seeds: the fewest paired seeds for a verdict (paper 002 averages three runs).
        measured: the metric is a wall-clock measurement (not byte-identical): the claim goes
            to the measured claims table.
    """

    id: str
    paper: str
    statement: str
    metric: str
    arm: str
    baseline: str
    test: Test
    needs: str
    evidence: tuple[str, ...]
    margin: float = 0.0
    smallest_effect: float = 0.0
    basis: str = ""
    combine: Combine = "every"
    primary: str = ""
    group: Group = "paper"
    min_seeds: int = MIN_SEEDS
    measured: bool = False

    def __post_init__(self) -> None:
        if (self.test == "equivalent") != (self.margin > 0):
            raise ValueError(f"claim {self.id}: an equivalence needs a margin > 0, only it")
        if self.test == "equivalent" and self.smallest_effect:
            raise ValueError(f"claim {self.id}: an equivalence has a margin, no smallest effect")
        if (self.combine == "primary") != bool(self.primary):
            raise ValueError(f"claim {self.id}: combine 'primary' needs a primary pattern, only it")
        if isinstance(self.evidence, str) or not self.evidence:
            raise ValueError(f"claim {self.id}: evidence is a non-empty tuple of file stems")


def decides(claim: Claim, cell: str) -> bool:
    """Whether `cell` is one of the cells that decide `claim` (its Holm family)."""
    return claim.combine != "primary" or fnmatchcase(cell, claim.primary)


def observations(rows: Sequence[dict]) -> pd.DataFrame:
    """The observation frame of `rows` (dicts with `OBSERVATION_COLUMNS`; `scale` and the runs
    optional)."""
    frame = pd.DataFrame(list(rows), columns=OBSERVATION_COLUMNS)
    for column in ("scale", "arm_run", "baseline_run"):
        frame[column] = frame[column].astype(object).fillna("")
    return frame


def paired(
    runs: pd.DataFrame,
    claim: str,
    metric: str,
    arm: Mapping[str, str],
    baseline: Mapping[str, str],
    cell: Sequence[str],
    scale: Callable[[dict], str] | None = None,
    tag: str = "",
) -> list[dict]:
    """Observations of `claim`: the runs (one row each, a `seed` column, a `run` column with the
    run's folder where known) matching `arm` paired by (cell, seed) with those matching
    `baseline`, comparing column `metric`. `arm` / `baseline` map a column to its value; the
    cell label names the values of `cell` and of the arm's columns (`dataset duke, ..., clip
    nsgd`), then `tag`. `scale` gets the pair's values (the baseline's columns suffixed
    `_base`) and returns its scale reason ('' none)."""
    if runs.empty:
        return []
    picked = [runs.loc[(runs[list(s)] == pd.Series(s)).all(axis=1)] for s in (arm, baseline)]
    merged = picked[0].merge(picked[1], on=[*cell, "seed"], suffixes=("", "_base"))
    out = []
    for row in merged.itertuples(index=False):
        values = row._asdict()
        label = ", ".join([*(f"{k} {values[k]}" for k in [*cell, *arm]), *([tag] if tag else [])])
        out.append(dict(claim=claim, cell=label, seed=int(values["seed"]), arm=values[metric],
                        baseline=values[f"{metric}_base"],
                        scale=scale(values) if scale else "", arm_run=values.get("run", ""),
                        baseline_run=values.get("run_base", "")))  # fmt: skip
    return out


def below(column: str, floor: float, reason: str) -> Callable[[dict], str]:
    """A `paired` scale: `reason` when both runs of a pair have `column` below `floor`."""

    def scale(values: dict) -> str:
        return reason if max(values[column], values[f"{column}_base"]) < floor else ""

    return scale


def paired_t_p(diff: np.ndarray, shift: float = 0.0, side: str = "two-sided") -> float:
    """p of the t-test of mean(diff) against `shift` (`two-sided`, `greater`: H1 mean >
    shift, `less`: H1 mean < shift); NaN below two values or without spread."""
    if diff.size < 2 or np.ptp(diff) == 0:
        return math.nan
    t = (diff.mean() - shift) / (diff.std(ddof=1) / math.sqrt(diff.size))
    lower = float(stdtr(diff.size - 1, t))  # P(T ≤ t)
    if side == "greater":
        return 1.0 - lower
    if side == "less":
        return lower
    return 2.0 * min(lower, 1.0 - lower)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count in the family)."""
    p = np.asarray(p_values, dtype=float)
    finite = np.flatnonzero(np.isfinite(p))
    adjusted = np.full(p.size, math.nan)
    running = 0.0
    for rank, index in enumerate(finite[np.argsort(p[finite], kind="stable")]):
        running = max(running, min(1.0, (finite.size - rank) * p[index]))
        adjusted[index] = running
    return adjusted.tolist()


def _test_p(claim: Claim, diff: np.ndarray) -> tuple[float, float]:
    """(p of the claim's test, p of |difference| > margin for an equivalence, else NaN)."""
    if claim.test != "equivalent":
        return paired_t_p(diff), math.nan
    m = claim.margin
    above, under = paired_t_p(diff, m, "greater"), paired_t_p(diff, -m, "less")
    tost = max(paired_t_p(diff, -m, "greater"), paired_t_p(diff, m, "less"))
    return tost, min(1.0, 2.0 * min(above, under))


def _dropped(group: pd.DataFrame) -> tuple[np.ndarray, str]:
    """The (arm, baseline) pairs of `group` kept (no scale reason, finite values), shape
    (n, 2), and what was dropped, counted by reason."""
    pairs = group[["arm", "baseline"]].to_numpy(float)
    finite = np.isfinite(pairs).all(axis=1)
    scales = zip(group["scale"].tolist(), finite.tolist(), strict=True)
    reasons = [why if ok else "no finite value" for why, ok in scales]
    counts = Counter(why for why in reasons if why)
    said = "; ".join(f"{n} of {len(group)} pairs dropped: {why}" for why, n in counts.items())
    return pairs[np.array([not why for why in reasons], dtype=bool)], said


def _row(study: str, claim: Claim, cell: str, group: pd.DataFrame | None) -> dict:
    row = {
        "study": study, "claim": claim.id, "group": claim.group, "paper": claim.paper,
        "statement": claim.statement, "cell": cell, "decides": decides(claim, cell),
        "metric": claim.metric, "comparison": f"{claim.arm} − {claim.baseline}",
        "test": claim.test, "margin": claim.margin if claim.test == "equivalent" else math.nan,
        "smallest_effect": claim.smallest_effect, "min_seeds": claim.min_seeds,
        "p": math.nan, "p_outside": math.nan, "dropped": "",
    }  # fmt: skip
    if group is None:  # stands for the claim's absent cells; decides nothing
        return row | {
            "n_seeds": 0,
            "decides": False,
            "reason": f"cells absent: needs {claim.needs}",
        }
    kept, row["dropped"] = _dropped(group)
    diff = kept[:, 0] - kept[:, 1]
    row["n_seeds"] = int(diff.size)
    if diff.size == 0:
        return row | {"reason": row["dropped"]}
    mean, low, high = t_interval(diff)
    row |= {
        "arm_mean": float(kept[:, 0].mean()), "baseline_mean": float(kept[:, 1].mean()),
        "diff_mean": mean, "diff_ci_low": low, "diff_ci_high": high,
    }  # fmt: skip
    if diff.size < claim.min_seeds:
        seeds = f"{diff.size} paired seed(s); the claim needs ≥ {claim.min_seeds}"
        return row | {"reason": "; ".join(filter(None, [seeds, row["dropped"]]))}
    row["p"], row["p_outside"] = _test_p(claim, diff)
    if math.isnan(row["p"]):
        return row | {"reason": "the paired differences have no spread: no test"}
    return row


def _verdict(row: dict) -> tuple[str, str]:
    """The verdict of a row whose p and Holm p are computed and which has no reason yet."""
    if row.get("reason"):
        return "inconclusive", row["reason"]
    p, mean = row["p_holm"], row["diff_mean"]
    low, high = row["diff_ci_low"], row["diff_ci_high"]
    interval = f"95 % interval of the difference [{low:.4g}, {high:.4g}], Holm p {p:.3g}"
    if row["dropped"]:
        interval += f" ({row['dropped']})"
    if row["test"] == "equivalent":
        margin = row["margin"]
        if p < ALPHA:
            return "supported", f"within ±{margin:g}: {interval}"
        if row["p_outside_holm"] < ALPHA:
            return "contradicted", (
                f"outside ±{margin:g}: {interval}, Holm p outside {row['p_outside_holm']:.3g}"
            )
        return "inconclusive", f"not shown within ±{margin:g}: {interval}"
    claimed = 1 if row["test"] == "greater" else -1
    if p < ALPHA and np.sign(mean) != claimed:
        return "contradicted", f"the other way: {interval}"
    if p < ALPHA and abs(mean) < row["smallest_effect"]:
        return "inconclusive", (
            f"below the smallest effect that matters ({row['smallest_effect']:g}): {interval}"
        )
    if p < ALPHA:
        return "supported", interval
    return "inconclusive", f"the interval spans zero: {interval}"


def cell_values(cell: str) -> dict[str, str]:
    """The wildcard values a cell label names (`dataset duke, model unet` → dataset, model)."""
    return dict(part.split(" ", 1) for part in cell.split(", ") if " " in part)


def evidence_files(patterns: Sequence[str], cell: str, shown: Sequence[str]) -> list[str]:
    """The report files among `shown` (paths) whose name stem matches one of a claim's
    evidence `patterns`, each pattern's wildcards filled from `cell` (`*` where the cell does
    not name one), in pattern order then `shown` order."""
    values = cell_values(cell)
    files: list[str] = []
    for pattern in patterns:
        stem = re.sub(r"\{(\w+)\}", lambda match: values.get(match[1], "*"), pattern)
        files += [f for f in shown if fnmatchcase(PurePath(f).stem, stem) and f not in files]
    return files


def evaluate(
    study: str, claims: Sequence[Claim], frame: pd.DataFrame, shown: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per claim and cell (`COLUMNS`): the paired difference, p, Holm p within the
    claim (its deciding cells one family, the others another), verdict and reason, and the
    report files among `shown` that show the compared values (`evidence`); a claim without
    observations gets one row (cell `—`)."""
    unknown = set(frame["claim"]) - {claim.id for claim in claims}
    if unknown:
        raise ValueError(f"observations of unregistered claims: {sorted(unknown)}")
    rows = []
    for claim in claims:
        mine = frame[frame["claim"] == claim.id]
        cells = [_row(study, claim, str(c), g) for c, g in mine.groupby("cell", sort=False)]
        cells = cells or [_row(study, claim, "—", None)]
        for deciding in (True, False):
            family = [row for row in cells if row["decides"] == deciding]
            for column in ("p", "p_outside"):
                tested = [math.nan if row.get("reason") else row[column] for row in family]
                for row, adjusted in zip(family, holm(tested), strict=True):
                    row[f"{column}_holm"] = adjusted
        for row in cells:
            row["verdict"], row["reason"] = _verdict(row)
            files = evidence_files(claim.evidence, row["cell"], shown)
            missing = "not in this run's report: " + ", ".join(claim.evidence)
            row["evidence"] = LINK_SEPARATOR.join(files) if files else missing
        rows += cells
    return pd.DataFrame(rows, columns=COLUMNS)


def _combined(claim: Claim, cells: pd.DataFrame) -> tuple[str, str]:
    """The claim's verdict and reason from its deciding cells' verdicts (`Claim.combine`)."""
    verdicts = cells["verdict"].tolist()
    n, yes, no = len(verdicts), verdicts.count("supported"), verdicts.count("contradicted")
    every = claim.combine != "any"
    if (every and yes == n) or (not every and yes):
        return "supported", f"supported in {yes} of {n} deciding cell(s)"
    if (every and no) or (not every and no == n):
        return "contradicted", f"contradicted in {no} of {n} deciding cell(s)"
    open_row = cells[cells["verdict"] == "inconclusive"].iloc[0]
    need = "every" if every else "one"
    return "inconclusive", (
        f"{yes} of {n} deciding cell(s) supported, {need} needed; {open_row['cell']}: "
        f"{open_row['reason']}"
    )


def _weakest(claim: Claim, cells: pd.DataFrame) -> pd.Series:
    """The deciding cell with the least evidence for the claim (smallest effect in the claimed
    direction, or largest |difference| for an equivalence); the first cell when none has one."""
    effect = cells["diff_mean"].astype(float)
    if claim.test == "equivalent":
        effect = -effect.abs()
    elif claim.test == "less":
        effect = -effect
    return cells.loc[effect.idxmin()] if effect.notna().any() else cells.iloc[0]


def claim_verdicts(claims: Sequence[Claim], cells: pd.DataFrame) -> pd.DataFrame:
    """One row per claim of `claims` found in `cells` (an `evaluate` table; `CLAIM_COLUMNS`):
    the verdict its deciding cells give together, and the weakest deciding cell's effect and
    95 % interval — the table the report shows first."""
    out = []
    for claim in claims:
        mine = cells[cells["claim"] == claim.id]
        if mine.empty:
            continue
        deciding = mine[mine["decides"].astype(bool)]
        # a deciding cell whose every pair is below the claim's scale (neither arm learned)
        # says nothing about the claim: left out, and counted, unless every cell is
        unscaled = (deciding["n_seeds"] == 0) & (deciding["dropped"] != "")
        if deciding.empty:  # the grid lacks the claim's cells, or has only context cells
            absent = (mine["cell"] == "—").all()
            verdict = "inconclusive"
            reason = mine.iloc[0]["reason"] if absent else (
                f"cells absent: no cell of this run is a deciding cell ({claim.primary})"
            )  # fmt: skip
            deciding = mine
        elif unscaled.all():
            verdict, reason = _combined(claim, deciding)
        else:
            verdict, reason = _combined(claim, deciding[~unscaled])
            if unscaled.any():
                reason += f"; {int(unscaled.sum())} deciding cell(s) left out: every pair dropped"
            deciding = deciding[~unscaled]
        weakest = _weakest(claim, deciding)
        seeds = deciding["n_seeds"].astype(int)
        out.append({
            "claim": claim.id, "verdict": verdict, "reason": reason, "study": weakest["study"],
            "group": claim.group, "paper": claim.paper, "statement": claim.statement,
            "metric": claim.metric, "comparison": weakest["comparison"], "test": claim.test,
            "combine": claim.combine if claim.combine != "primary" else f"primary: {claim.primary}",
            "cells": len(deciding),
            "supported_cells": int((deciding["verdict"] == "supported").sum()),
            "contradicted_cells": int((deciding["verdict"] == "contradicted").sum()),
            "weakest_cell": weakest["cell"], "effect": weakest["diff_mean"],
            "effect_low": weakest["diff_ci_low"], "effect_high": weakest["diff_ci_high"],
            "smallest_effect": claim.smallest_effect, "margin": weakest["margin"],
            "basis": claim.basis, "n_seeds": _span(seeds), "evidence": weakest["evidence"],
        })  # fmt: skip
    return pd.DataFrame(out, columns=CLAIM_COLUMNS)


def _span(values: pd.Series) -> str:
    low, high = int(values.min()), int(values.max())
    return str(low) if low == high else f"{low}–{high}"


def registered_claims(reader: str) -> Sequence[Claim]:
    """The `CLAIMS` registry of the module of a study's claims `reader` ("module:function")."""
    return resolve(reader.partition(":")[0] + ":CLAIMS")


def claims_evidence(
    readers: Sequence[str], shown: Sequence[str], measured: bool = False
) -> dict[str, list[str]]:
    """Claim id → every file among `shown` that its evidence names, for the claims (measured
    or not) of the studies whose claims `readers` are given: the report's links beside the
    claims tables."""
    return {
        claim.id: evidence_files(claim.evidence, "", shown)
        for reader in readers
        for claim in registered_claims(reader)
        if claim.measured == measured
    }


@dataclass(frozen=True)
class ClaimsTables:
    """A run's claims: per claim (`CLAIM_COLUMNS`) and per claim and cell (`COLUMNS`), and the
    paired observations (`OBSERVATION_COLUMNS` with `study`: what the power planner reads), for
    the paper's metrics and apart for its wall-clock ones (not byte-identical between runs)."""

    claims: pd.DataFrame
    cells: pd.DataFrame
    measured: pd.DataFrame
    measured_cells: pd.DataFrame
    pairs: pd.DataFrame
    measured_pairs: pd.DataFrame


def claims_tables(
    studies: Mapping[str, tuple[Sequence[Claim], pd.DataFrame]], shown: Sequence[str] = ()
) -> ClaimsTables:
    """`evaluate` and `claim_verdicts` per study and kind (measured or not), in study order,
    linking the report files among `shown`."""
    pairs = ["study", *OBSERVATION_COLUMNS]
    columns = {"claims": CLAIM_COLUMNS, "cells": COLUMNS, "pairs": pairs, "measured": CLAIM_COLUMNS,
               "measured_cells": COLUMNS, "measured_pairs": pairs}  # fmt: skip
    parts: dict[str, list[pd.DataFrame]] = {name: [] for name in columns}
    for study, (claims, frame) in studies.items():
        for measured, names in (
            (False, ("claims", "cells", "pairs")),
            (True, ("measured", "measured_cells", "measured_pairs")),
        ):
            kind = [c for c in claims if c.measured == measured]
            if kind:
                mine = frame[frame["claim"].isin({c.id for c in kind})]
                cells = evaluate(study, kind, mine, shown)
                tables = (claim_verdicts(kind, cells), cells, mine.assign(study=study))
                for name, table in zip(names, tables, strict=True):
                    parts[name].append(table)
    return ClaimsTables(**{
        name: pd.concat(frames, ignore_index=True)[columns[name]] if frames
        else pd.DataFrame(columns=columns[name])
        for name, frames in parts.items()
    })  # fmt: skip


def verdict_counts(claims: pd.DataFrame, cells: pd.DataFrame, config: str) -> pd.DataFrame:
    """Per study and group of a claim-level table (`CLAIM_COLUMNS`), in table order: its paper,
    the run's `config`, how many claims are each of `VERDICTS`, the claims, and the paired
    seeds per deciding cell (fewest–most, from the cell table `cells`): the report front page's
    answer."""
    rows = []
    for (study, group), mine in claims.groupby(["study", "group"], sort=False):
        papers = mine["paper"].astype(str).str.extract(r"(paper \d+)")[0].dropna().unique()
        seeds = cells[(cells["study"] == study) & cells["claim"].isin(mine["claim"])
                      & cells["decides"].astype(bool)]["n_seeds"]  # fmt: skip
        counts = mine["verdict"].value_counts()
        rows.append(
            {"study": study, "paper": ", ".join(papers), "claims of": GROUP_LABELS[group],
             "config": config}
            | {verdict: int(counts.get(verdict, 0)) for verdict in VERDICTS}
            | {"claims": len(mine), "paired_seeds": _span(seeds) if len(seeds) else "0"}
        )  # fmt: skip
    columns = ["study", "paper", "claims of", "config", *VERDICTS, "claims", "paired_seeds"]
    return pd.DataFrame(rows, columns=columns)
