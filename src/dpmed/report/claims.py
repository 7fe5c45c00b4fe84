"""Which of a paper's claims this run supports: each claim a paired comparison over seeds,
with a verdict and its reason.

A study registers its paper's claims (`Claim`: id, paper section, the claim in our words, the
compared arms, the metric, a direction or an equivalence margin, the minimum evidence) and a
function that reads its runs into observations: one row per claim, cell (the compared runs'
shared wildcards) and seed, with the arm's and the baseline's values (`OBSERVATION_COLUMNS`).
`evaluate` turns them into one row per claim and cell:

- `diff_mean`, `diff_ci_low`, `diff_ci_high`: the mean over seeds of arm − baseline and its
  95 % Student-t interval (`dpmed.report.intervals.t_interval`);
- `p`: for a direction, the two-sided paired t-test; for an equivalence within ±margin, the
  two one-sided tests (TOST: the larger of the two one-sided p); `p_holm`: Holm's step-down
  correction over the p of every tested row of the study's table (family-wise error ≤
  `ALPHA`; a row stopped before the test, e.g. by too few seeds, is not in the family);
- `verdict`: `supported` (p_holm < `ALPHA` in the claimed direction, or equivalence shown),
  `contradicted` (p_holm < `ALPHA` the other way, or the 95 % interval entirely outside the
  margin), else `inconclusive`, with `reason`: the cells absent from the grid, fewer paired
  seeds than the claim needs, a scale reason the study gives (e.g. a baseline that did not
  learn), or the interval spanning zero / the margin.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import PurePath
from typing import Literal

import numpy as np
import pandas as pd
from scipy.special import stdtr

from dpmed.report.intervals import MIN_SEEDS, t_interval
from dpmed.report.outputs import LINK_SEPARATOR

ALPHA = 0.05
Test = Literal["greater", "less", "equivalent"]
OBSERVATION_COLUMNS = ["claim", "cell", "seed", "arm", "baseline", "scale"]
# What a reader needs first (claim, cell, verdict, reason), then the test behind the verdict.
COLUMNS = [
    "claim", "cell", "verdict", "reason", "study", "paper", "statement", "metric", "comparison",
    "test", "margin", "n_seeds", "min_seeds", "arm_mean", "baseline_mean", "diff_mean",
    "diff_ci_low", "diff_ci_high", "p", "p_holm", "evidence",
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
    min_seeds: int = MIN_SEEDS
    measured: bool = False

    def __post_init__(self) -> None:
        if (self.test == "equivalent") != (self.margin > 0):
            raise ValueError(f"claim {self.id}: an equivalence needs a margin > 0, only it")
        if isinstance(self.evidence, str) or not self.evidence:
            raise ValueError(f"claim {self.id}: evidence is a non-empty tuple of file stems")


def observations(rows: Sequence[dict]) -> pd.DataFrame:
    """The observation frame of `rows` (dicts with `OBSERVATION_COLUMNS`; `scale` optional)."""
    frame = pd.DataFrame(list(rows), columns=OBSERVATION_COLUMNS)
    frame["scale"] = frame["scale"].fillna("")
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
    """Observations of `claim`: the runs (one row each, a `seed` column) matching `arm` paired
    by (cell, seed) with those matching `baseline`, comparing column `metric`. `arm` /
    `baseline` map a column to its value; the cell label names the values of `cell` and of
    the arm's columns (`dataset duke, ..., clip nsgd`), then `tag`. `scale` gets the pair's
    values (the baseline's columns suffixed `_base`) and returns its scale reason ('' none)."""
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
                        scale=scale(values) if scale else ""))  # fmt: skip
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


def _test_p(claim: Claim, diff: np.ndarray) -> float:
    if claim.test != "equivalent":
        return paired_t_p(diff)
    # TOST: reject both d ≤ −margin and d ≥ margin
    return max(paired_t_p(diff, -claim.margin, "greater"), paired_t_p(diff, claim.margin, "less"))


def _row(study: str, claim: Claim, cell: str, group: pd.DataFrame | None) -> dict:
    row = {
        "study": study, "claim": claim.id, "paper": claim.paper, "statement": claim.statement,
        "cell": cell, "metric": claim.metric, "comparison": f"{claim.arm} − {claim.baseline}",
        "test": claim.test, "margin": claim.margin if claim.test == "equivalent" else math.nan,
        "min_seeds": claim.min_seeds,
    }  # fmt: skip
    if group is None:
        return row | {"n_seeds": 0, "p": math.nan, "reason": f"cells absent: needs {claim.needs}"}
    group = group[np.isfinite(group["arm"]) & np.isfinite(group["baseline"])]
    diff = (group["arm"] - group["baseline"]).to_numpy(float)
    row["n_seeds"] = int(diff.size)
    if diff.size == 0:
        return row | {"p": math.nan, "reason": "no finite value in the compared runs"}
    mean, low, high = t_interval(diff)
    row |= {
        "arm_mean": float(group["arm"].mean()), "baseline_mean": float(group["baseline"].mean()),
        "diff_mean": mean, "diff_ci_low": low, "diff_ci_high": high, "p": _test_p(claim, diff),
    }  # fmt: skip
    scale = sorted(set(group["scale"]) - {""})
    if scale:
        return row | {"reason": "; ".join(scale)}
    if diff.size < claim.min_seeds:
        return row | {"reason": f"{diff.size} paired seed(s); the claim needs ≥ {claim.min_seeds}"}
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
    if row["test"] == "equivalent":
        margin = row["margin"]
        if p < ALPHA:
            return "supported", f"within ±{margin:g}: {interval}"
        if low > margin or high < -margin:
            return "contradicted", f"outside ±{margin:g}: {interval}"
        return "inconclusive", f"not shown within ±{margin:g}: {interval}"
    claimed = 1 if row["test"] == "greater" else -1
    if p < ALPHA:
        if np.sign(mean) == claimed:
            return "supported", interval
        return "contradicted", f"the other way: {interval}"
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


def _evidence(claim: Claim, cell: str, shown: Sequence[str]) -> str:
    files = evidence_files(claim.evidence, cell, shown)
    if files:
        return LINK_SEPARATOR.join(files)
    return "not in this run's report: " + ", ".join(claim.evidence)


def evaluate(
    study: str, claims: Sequence[Claim], frame: pd.DataFrame, shown: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per claim and cell (`COLUMNS`): the paired difference, p, Holm p over the
    study's rows, verdict and reason, and the report files among `shown` that show the
    compared values (`evidence`); a claim without observations gets one row (cell `—`)."""
    known = {claim.id for claim in claims}
    unknown = set(frame["claim"]) - known
    if unknown:
        raise ValueError(f"observations of unregistered claims: {sorted(unknown)}")
    by_id = {claim.id: claim for claim in claims}
    rows = []
    for claim in claims:
        mine = frame[frame["claim"] == claim.id]
        if mine.empty:
            rows.append(_row(study, claim, "—", None))
        for cell, group in mine.groupby("cell", sort=False):
            rows.append(_row(study, claim, str(cell), group))
    # the family: the rows that are tested (no reason to stop before the test)
    family = [math.nan if row.get("reason") else row["p"] for row in rows]
    for row, adjusted in zip(rows, holm(family), strict=True):
        row["p_holm"] = adjusted
        row["verdict"], row["reason"] = _verdict(row)
        row["evidence"] = _evidence(by_id[row["claim"]], row["cell"], shown)
    return pd.DataFrame(rows, columns=COLUMNS)


def registered_claims(reader: str) -> Sequence[Claim]:
    """The `CLAIMS` registry of the module of a study's claims `reader` ("module:function")."""
    return importlib.import_module(reader.split(":")[0]).CLAIMS


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


def study_claims(
    reader: str, inputs: Mapping[str, Sequence[str]]
) -> tuple[Sequence[Claim], pd.DataFrame]:
    """A study's claims and observations: its `reader` ("module:function") called with its
    named input lists."""
    module, function = reader.split(":")
    return getattr(importlib.import_module(module), function)(**inputs)


def claims_tables(
    studies: Mapping[str, tuple[Sequence[Claim], pd.DataFrame]], shown: Sequence[str] = ()
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(claims, measured claims): `evaluate` per study and kind (Holm within each), in study
    order, linking the report files among `shown`."""
    tables: dict[bool, list[pd.DataFrame]] = {False: [], True: []}
    for study, (claims, frame) in studies.items():
        for measured in (False, True):
            kind = [c for c in claims if c.measured == measured]
            if kind:
                ids = {c.id for c in kind}
                tables[measured].append(
                    evaluate(study, kind, frame[frame["claim"].isin(ids)], shown)
                )
    return tuple(
        pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)
        for parts in (tables[False], tables[True])
    )


def verdict_counts(claims: pd.DataFrame, config: str) -> pd.DataFrame:
    """Per study of a claims table (`COLUMNS`), in table order: its paper, the run's `config`,
    how many of its rows (claim × cell) are each of `VERDICTS`, the rows, and the paired
    seeds per cell (fewest–most): the report front page's answer."""
    rows = []
    for study, group in claims.groupby("study", sort=False):
        papers = group["paper"].astype(str).str.extract(r"^(paper \d+)")[0].dropna().unique()
        seeds = group["n_seeds"].astype(int)
        low, high = seeds.min(), seeds.max()
        counts = group["verdict"].value_counts()
        rows.append(
            {"study": study, "paper": ", ".join(papers), "config": config}
            | {verdict: int(counts.get(verdict, 0)) for verdict in VERDICTS}
            | {"rows": len(group), "paired_seeds": str(low) if low == high else f"{low}–{high}"}
        )
    columns = ["study", "paper", "config", *VERDICTS, "rows", "paired_seeds"]
    return pd.DataFrame(rows, columns=columns)
