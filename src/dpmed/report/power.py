"""How many seeds each paper claim needs, and what they cost: a power plan from a run's paired
differences (`results/tables/claims_pairs.csv`, the claims engine's observations).

Per claim, from its pairs that are not dropped (empty `scale`), each deciding cell
(`dpmed.report.claims.decides`) gives an effect (the mean paired difference arm − baseline, in
the metric's unit) and its SD over seeds. Taking them as the truth, the seeds needed are the
fewest (at least the claim's `min_seeds`, at most `MAX_SEEDS`) that give the claim's test
`POWER` at Holm's first-step level `ALPHA / k` (k: the claim's deciding cells): a direction is
the two-sided paired t-test, whose power comes from the noncentral t; an equivalence is TOST
within ±margin, whose power is integrated over the sample SD. A claim that needs every
deciding cell plans for its weakest cell, one that needs any for its best. No plan when a cell
has fewer than two pairs or no spread, when a direction's |effect| is below the claim's
smallest effect, or when an equivalence's |effect| is not inside its margin.

The compute is the seeds × one seed's runs (the deciding cells' arm and baseline run folders,
seed dropped), each priced by the job-cost model (`dpmed.job_cost.predicted`, every sized rule
that runs the job; GPU time ÷ `resources.gpu_speedup`) under a target config: a run whose cell
is in the target's grid with that cell's hyperparameters, one that is not with the study's
defaults there (as Snakemake runs an off-grid cell), its `grid_seeds` then 0. A claim is
decidable on the target grid when its seeds needed are at most the grid's seeds of every run.

    python -m dpmed.report.power [--pairs results/tables/claims_pairs.csv]
                                 [--config config/config.yaml] [--markdown]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from dpmed.config.grid import Grid, Job, wildcards_from_path
from dpmed.job_cost import MODEL, predicted
from dpmed.report.claims import ALPHA, RUNS_SEPARATOR, Claim, decides, registered_claims
from dpmed.sizing import study_sizing
from dpmed.studies import STUDIES, claims_reader

POWER = 0.8
MAX_SEEDS = 1000
CPU_HOURS, GPU_HOURS = (f"{kind}_hours predicted ({MODEL})" for kind in ("cpu", "gpu"))
# The answer first (the cell planned for, its effect and SD, the seeds, their compute, whether
# the target grid has them), then how it was planned.
COLUMNS = [
    "study", "claim", "cell", "effect", "sd", "level", "seeds_needed", CPU_HOURS, GPU_HOURS,
    "grid_seeds", "decidable", "reason", "test", "combine", "deciding_cells", "threshold",
    "pairs", "expected", "runs_per_seed",
]  # fmt: skip
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(128)
# (study, a run's wildcards) → (CPU seconds, GPU seconds, seeds of its cell in the target grid)
Cost = Callable[[str, Mapping[str, str]], tuple[float, float, int]]


def t_power(effect: float, sd: float, n: int, level: float) -> float:
    """Power of the two-sided paired t-test at `level` with `n` pairs of true mean difference
    `effect` and SD `sd`: the chance to reject in the effect's direction (noncentral t)."""
    df = n - 1
    return float(stats.nct.sf(stats.t.ppf(1 - level / 2, df), df, abs(effect) / sd * math.sqrt(n)))


def tost_power(effect: float, sd: float, n: int, level: float, margin: float) -> float:
    """Power of TOST (both one-sided t-tests at `level`) to show |mean difference| < `margin`:
    P(−margin + t·s/√n < d̄ < margin − t·s/√n) with d̄ normal, integrated over the χ² quantile
    of the sample SD s (Gauss–Legendre); 0 where the two tests cannot both reject."""
    df = n - 1
    crit = stats.t.ppf(1 - level, df)
    a, b = margin * math.sqrt(n) / sd, effect * math.sqrt(n) / sd  # in units of σ/√n
    top = stats.chi2.cdf(df * (a / crit) ** 2, df)  # above this quantile of s: no rejection
    w = crit * np.sqrt(stats.chi2.ppf((_NODES + 1) / 2 * top, df) / df)
    inside = np.clip(stats.norm.cdf(a - w - b) - stats.norm.cdf(w - a - b), 0.0, None)
    return float(top / 2 * np.dot(_WEIGHTS, inside))


def smallest_n(power: Callable[[int], float], least: int) -> float:
    """The fewest n in [least, MAX_SEEDS] with power(n) ≥ `POWER` (power rises with n);
    inf when even `MAX_SEEDS` falls short."""
    if power(MAX_SEEDS) < POWER:
        return math.inf
    if power(least) >= POWER:
        return least
    low, high = least, MAX_SEEDS
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if power(mid) >= POWER else (mid, high)
    return high


def cell_plan(claim: Claim, group: pd.DataFrame, level: float) -> dict:
    """One deciding cell's pairs `group` → its pairs kept, effect, SD, seeds needed (NaN: no
    plan, inf: more than `MAX_SEEDS`) and the reason."""
    kept = group[group["scale"] == ""]
    diff = (kept["arm"] - kept["baseline"]).to_numpy(float)
    diff = diff[np.isfinite(diff)]
    row = {"cell": group["cell"].iloc[0], "pairs": diff.size, "seeds_needed": math.nan,
           "effect": diff.mean() if diff.size else math.nan,
           "sd": diff.std(ddof=1) if diff.size > 1 else math.nan}  # fmt: skip
    effect, sd, least = row["effect"], row["sd"], max(2, claim.min_seeds)
    dropped = sorted(set(group["scale"]) - {""})
    if diff.size < 2 or not sd > 0:
        reason = f"dropped: {'; '.join(dropped)}" if dropped else "under 2 pairs or no spread"
        return row | {"reason": f"{reason}: no SD to plan from"}
    if claim.test == "equivalent":
        if abs(effect) >= claim.margin:
            return row | {"reason": f"effect outside ±{claim.margin:g}: no seed count shows "
                                    "equivalence"}  # fmt: skip
        n = smallest_n(lambda k: tost_power(effect, sd, k, level, claim.margin), least)
    else:
        if abs(effect) < claim.smallest_effect:
            return row | {"reason": f"effect below the smallest effect {claim.smallest_effect:g}:"
                                    " no seed count supports it"}  # fmt: skip
        n = smallest_n(lambda k: t_power(effect, sd, k, level), least)
    return row | {"seeds_needed": n, "reason": f"> {MAX_SEEDS} seeds" if math.isinf(n) else ""}


def _expected(claim: Claim, effect: float) -> str:
    """The verdict the plan powers: the claimed one, or `contradicted` for a direction whose
    effect points the other way."""
    claimed = {"greater": 1, "less": -1}.get(claim.test, np.sign(effect))
    return "supported" if np.sign(effect) == claimed else "contradicted"


def _runs(frame: pd.DataFrame) -> list[tuple[str, dict[str, str]]]:
    """One seed's runs of `frame`'s pairs: (study, wildcards) of each distinct run folder,
    its seed aside (the first seed's wildcards kept)."""
    runs: dict[tuple, tuple[str, dict[str, str]]] = {}
    for column in ("arm_run", "baseline_run"):
        for study, paths in zip(frame["study"], frame[column], strict=True):
            for path in filter(None, str(paths).split(RUNS_SEPARATOR)):
                wc = wildcards_from_path(study, path)
                cell = tuple(sorted((k, v) for k, v in wc.items() if k != "seed"))
                runs.setdefault((study, cell), (study, wc))
    return list(runs.values())


def plan_claim(claim: Claim, pairs: pd.DataFrame, cost: Cost) -> dict:
    """The plan row (`COLUMNS`) of `claim` from its `pairs` (claims_pairs rows): its deciding
    cells' weakest plan (the best for `combine` `any`) and the compute of those seeds."""
    cells = [c for c in dict.fromkeys(pairs["cell"]) if decides(claim, c)]
    level = ALPHA / max(1, len(cells))
    row = {"claim": claim.id, "test": claim.test, "combine": claim.combine, "level": level,
           "threshold": claim.margin if claim.test == "equivalent" else claim.smallest_effect,
           "deciding_cells": len(cells), "pairs": 0, "runs_per_seed": 0, "grid_seeds": 0,
           "decidable": "no"}  # fmt: skip
    if not cells:
        return row | {"reason": "no pairs in this run"}
    deciding = pairs[pairs["cell"].isin(cells)]
    plans = [cell_plan(claim, deciding[deciding["cell"] == c], level) for c in cells]
    # rank: a plan, then more than the cap, then no plan
    rank = [(p["seeds_needed"], 0) if not math.isnan(p["seeds_needed"]) else (math.inf, 1)
            for p in plans]  # fmt: skip
    pick = min if claim.combine == "any" else max
    row |= plans[pick(range(len(plans)), key=rank.__getitem__)]
    n, runs = row["seeds_needed"], _runs(deciding)
    priced = [cost(study, wc) for study, wc in runs]
    row |= {"runs_per_seed": len(runs), "grid_seeds": min((p[2] for p in priced), default=0)}
    if not runs:
        return row | {"reason": "; ".join(filter(None, [row["reason"], "no run folder named"]))}
    if math.isfinite(n):
        row |= {"expected": _expected(claim, row["effect"]),
                CPU_HOURS: n * sum(p[0] for p in priced) / 3600,
                GPU_HOURS: n * sum(p[1] for p in priced) / 3600,
                "decidable": "yes" if n <= row["grid_seeds"] else "no"}  # fmt: skip
    return row


def grid_cost(config: Mapping, grid: Grid) -> Cost:
    """`Cost` of a run under the validated target `config` and its `grid`: the job-cost
    model's seconds on CPU and on GPU summed over the sized rules that run the job."""

    def cost(study: str, wildcards: Mapping[str, str]) -> tuple[float, float, int]:
        spec = STUDIES[study]
        same = [j for j in grid.jobs(study)
                if all(j.wc[k] == v for k, v in wildcards.items() if k != "seed")]  # fmt: skip
        job = same[0] if same else Job(
            study, tuple((wc, wildcards[wc]) for _, wc in spec.axes),
            grid.params(study, wildcards), "", {k: bool(v) for k, v in spec.switches.items()},
        )  # fmt: skip
        rules = [r for r, sizing in study_sizing(study).rules.items() if sizing.runs([job])]
        cpu, gpu = (sum(predicted(r, config, job.wc, job.params, on)[1] for r in rules)
                    for on in (False, True))  # fmt: skip
        return cpu, gpu, len(same)

    return cost


def plan(pairs: pd.DataFrame, claims: Mapping[str, Sequence[Claim]], cost: Cost) -> pd.DataFrame:
    """One plan row (`COLUMNS`) per claim of `claims` (study → its claims, in order), from
    the claims_pairs frame `pairs` (the claims engine's observation columns and `study`)."""
    rows = [
        {"study": study} | plan_claim(claim, pairs[pairs["claim"] == claim.id], cost)
        for study, mine in claims.items()
        for claim in mine
    ]
    counts = ["deciding_cells", "pairs", "runs_per_seed", "grid_seeds"]
    return pd.DataFrame(rows, columns=COLUMNS).astype(dict.fromkeys(counts, int))


def power_plan(pairs_csv: str, config: Mapping, grid: Grid) -> pd.DataFrame:
    """The plan of the claims_pairs file `pairs_csv` under the target `config`, for the
    registered claims of its studies (registry order)."""
    text = ["scale", "arm_run", "baseline_run"]
    pairs = pd.read_csv(pairs_csv, dtype=dict.fromkeys(text, str))
    pairs[text] = pairs[text].fillna("")
    claims = {name: registered_claims(claims_reader(name)) for name, spec in STUDIES.items()
              if name in set(pairs["study"]) and spec.claims}  # fmt: skip
    return plan(pairs, claims, grid_cost(config, grid))


def write_power_plan(pairs: Sequence[str], csv_path: str, target: str) -> None:
    """results/tables/power_plan.csv (+ .md, .html): the plan of the claims_pairs file
    `pairs[0]` under the config file `target` (the paper config)."""
    from dpmed.config.checks import checked_configs
    from dpmed.report.style import write_table

    _, config, grid = checked_configs("dpmed.report.power", None, [str(target)])
    write_table(power_plan(pairs[0], config, grid), csv_path)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the power plan of `--pairs` under `--config` (as a Markdown table with
    `--markdown`)."""
    from dpmed.config.checks import checked_configs
    from dpmed.report.style import to_markdown

    parser = argparse.ArgumentParser(
        prog="python -m dpmed.report.power",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pairs", default="results/tables/claims_pairs.csv")
    parser.add_argument("--config", nargs="+", default=[], metavar="FILE")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    _, config, grid = checked_configs("dpmed.report.power", __doc__, args.config)
    frame = power_plan(args.pairs, config, grid)
    print((to_markdown(frame) if args.markdown else frame.to_string(index=False)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
