"""The power planner (`dpmed.report.power`): the power of its tests against Monte-Carlo
simulations of the t-test and TOST with known truth, the seeds it plans against those
simulations, how a claim's cells combine, when there is no plan, and the compute against a hand
computation with a stub cost."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpmed.config.checks import checked_configs
from dpmed.job_cost import predicted
from dpmed.report import power
from dpmed.report.claims import ALPHA, Claim
from dpmed.report.power import (
    CPU_HOURS,
    GPU_HOURS,
    MAX_SEEDS,
    POWER,
    cell_plan,
    grid_cost,
    plan_claim,
    t_power,
    tost_power,
)

REPS = 40_000
TOL = 4 * math.sqrt(POWER * (1 - POWER) / REPS)  # four binomial SEs of a simulated power
SEG = "results/seg/duke/unet/{clip}/none/eps200/seed{seed}"


def claim(test: str = "greater", **kw) -> Claim:
    return Claim("seg-x", "paper 0 §1", "claim x", "score", "a", "b", test, "a and b runs",
                 ("table_x",), **kw)  # fmt: skip


def simulated_t(effect: float, sd: float, n: int, level: float, seed: int = 0) -> float:
    """Share of simulated paired samples the two-sided t-test rejects in the effect's side."""
    diff = np.random.default_rng(seed).normal(effect, sd, (REPS, n))
    result = stats.ttest_1samp(diff, 0.0, axis=1)
    return float(np.mean((result.pvalue < level) & (np.sign(result.statistic) == np.sign(effect))))


def simulated_tost(effect: float, sd: float, n: int, level: float, margin: float) -> float:
    """Share of simulated paired samples where both one-sided tests reject at `level`."""
    diff = np.random.default_rng(1).normal(effect, sd, (REPS, n))
    above = stats.ttest_1samp(diff, -margin, axis=1, alternative="greater").pvalue
    below = stats.ttest_1samp(diff, margin, axis=1, alternative="less").pvalue
    return float(np.mean((above < level) & (below < level)))


def pairs(cell: str, diffs, clip: str = "nsgd", scale: str = "", seeds=None) -> pd.DataFrame:
    """claims_pairs rows of one cell: seed s has difference diffs[s], seg run folders."""
    seeds = range(len(diffs)) if seeds is None else seeds
    return pd.DataFrame([
        dict(study="seg", claim="seg-x", cell=cell, seed=s, arm=0.5 + d, baseline=0.5, scale=scale,
             arm_run=SEG.format(clip=clip, seed=s), baseline_run=SEG.format(clip="flat", seed=s))
        for s, d in zip(seeds, diffs, strict=True)
    ])  # fmt: skip


def with_sd(effect: float, sd: float, n: int = 6) -> np.ndarray:
    """n differences with exactly this mean and SD."""
    z = np.linspace(-1, 1, n)
    return effect + sd * (z - z.mean()) / z.std(ddof=1)


def free(study, wildcards):  # a stub cost: nothing, one seed in the grid
    return 0.0, 0.0, 1


@pytest.mark.parametrize(
    "effect, sd, n, level", [(0.5, 1, 10, 0.05), (-0.3, 0.5, 20, 0.01), (1, 1, 4, 0.0125)]
)
def test_t_power_matches_a_simulated_t_test(effect, sd, n, level):
    assert t_power(effect, sd, n, level) == pytest.approx(
        simulated_t(effect, sd, n, level), abs=TOL
    )


@pytest.mark.parametrize(
    "effect, sd, n, level, margin",
    [(0, 1, 10, 0.05, 1), (0.2, 0.5, 8, 0.025, 0.5), (-0.1, 1, 30, 0.05, 0.6), (0, 1, 3, 0.05, 2)],
)
def test_tost_power_matches_simulated_two_one_sided_tests(effect, sd, n, level, margin):
    assert tost_power(effect, sd, n, level, margin) == pytest.approx(
        simulated_tost(effect, sd, n, level, margin), abs=TOL
    )


def test_planned_seeds_are_the_fewest_with_80_percent_power_in_simulation():
    # two deciding cells: each is tested at ALPHA / 2; the weak one sets the claim's seeds
    frame = pd.concat([pairs("strong", with_sd(-0.9, 0.5)),
                       pairs("weak", with_sd(-0.3, 0.5), clip="psac")])  # fmt: skip
    row = plan_claim(claim("less"), frame, free)
    n = row["seeds_needed"]
    assert (row["cell"], row["level"], row["expected"]) == ("weak", ALPHA / 2, "supported")
    assert simulated_t(-0.3, 0.5, n, ALPHA / 2) >= POWER - TOL
    assert simulated_t(-0.3, 0.5, n - 1, ALPHA / 2) < POWER + TOL
    equivalent = claim("equivalent", margin=0.5)
    m = cell_plan(equivalent, pairs("c", with_sd(0.1, 0.4)), ALPHA)["seeds_needed"]
    assert simulated_tost(0.1, 0.4, m, ALPHA, 0.5) >= POWER - TOL
    assert simulated_tost(0.1, 0.4, m - 1, ALPHA, 0.5) < POWER + TOL


def test_seeds_fall_with_the_effect_and_rise_with_the_sd_and_the_family():
    def n(effect, sd, level=ALPHA, test="greater", **kw):
        return cell_plan(claim(test, **kw), pairs("c", with_sd(effect, sd)), level)["seeds_needed"]

    by_effect = [n(e, 1.0) for e in (0.2, 0.4, 0.8, 1.6)]
    by_sd = [n(0.5, s) for s in (0.25, 0.5, 1.0, 2.0)]
    by_level = [n(0.5, 1.0, ALPHA / k) for k in (1, 2, 4, 8)]
    assert by_effect == sorted(by_effect, reverse=True) and len(set(by_effect)) == 4
    assert by_sd == sorted(by_sd) and len(set(by_sd)) == 4
    assert by_level == sorted(by_level) and len(set(by_level)) == 4
    by_margin = [n(0.05, 0.3, test="equivalent", margin=m) for m in (0.2, 0.4, 0.8)]
    assert by_margin == sorted(by_margin, reverse=True) and len(set(by_margin)) > 1
    assert n(10.0, 1.0) == 3  # never fewer than the claim's min_seeds


def test_no_plan_says_why():
    def plan(frame, **kw):
        return cell_plan(claim(**kw), frame, ALPHA)

    flat = plan(pairs("c", [0.1, 0.1, 0.1]))
    assert math.isnan(flat["seeds_needed"]) and "no SD" in flat["reason"]
    assert math.isnan(plan(pairs("c", [0.1]))["seeds_needed"])
    dropped = plan(pairs("c", [0.1, 0.3, 0.2], scale="neither arm learned"))
    assert math.isnan(dropped["seeds_needed"]) and "neither arm learned" in dropped["reason"]
    small = plan(pairs("c", with_sd(0.02, 0.01)), smallest_effect=0.05)
    assert math.isnan(small["seeds_needed"]) and "smallest effect 0.05" in small["reason"]
    outside = plan(pairs("c", with_sd(0.3, 0.1)), test="equivalent", margin=0.2)
    assert math.isnan(outside["seeds_needed"]) and "outside ±0.2" in outside["reason"]
    tiny = plan(pairs("c", with_sd(0.001, 1.0)))
    assert math.isinf(tiny["seeds_needed"]) and f"> {MAX_SEEDS}" in tiny["reason"]
    other_way = plan_claim(claim("less"), pairs("c", with_sd(0.5, 0.5)), free)
    assert other_way["expected"] == "contradicted"


def test_combine_picks_the_weakest_the_best_or_the_primary_cell():
    frame = pd.concat([pairs("eps 8", with_sd(0.9, 0.5)),
                       pairs("eps 1", with_sd(0.3, 0.5), clip="psac"),
                       pairs("eps 2", [0.2, 0.2, 0.2], clip="autos")])  # fmt: skip
    every = plan_claim(claim(), frame, free)
    assert (every["cell"], every["deciding_cells"]) == ("eps 2", 3)  # no plan: none for all
    assert math.isnan(every["seeds_needed"]) and every["decidable"] == "no"
    best = plan_claim(claim(combine="any"), frame, free)
    strong = cell_plan(claim(), frame[frame["cell"] == "eps 8"], ALPHA / 3)["seeds_needed"]
    assert (best["cell"], best["seeds_needed"]) == ("eps 8", strong)
    primary = plan_claim(claim(combine="primary", primary="eps [18]"), frame, free)
    assert (primary["cell"], primary["deciding_cells"], primary["level"]) == ("eps 1", 2, ALPHA / 2)


def test_compute_is_the_seeds_times_one_seeds_runs():
    # two cells share the flat baseline: one seed needs three runs; the non-deciding cell's
    # run (autos) is not priced
    frame = pd.concat([pairs("nsgd", with_sd(0.4, 0.3)),
                       pairs("psac", with_sd(0.5, 0.3), clip="psac"),
                       pairs("autos", with_sd(0.5, 0.3), clip="autos")])  # fmt: skip
    price = {"nsgd": (3600.0, 36.0, 9), "psac": (7200.0, 72.0, 5), "flat": (1800.0, 18.0, 4)}

    def cost(study, wildcards):
        assert study == "seg" and wildcards["dataset"] == "duke"
        return price[wildcards["clip"]]

    row = plan_claim(claim(combine="primary", primary="[np]*"), frame, cost)
    n = row["seeds_needed"]
    assert row["runs_per_seed"] == 3 and row["grid_seeds"] == 4
    assert row[CPU_HOURS] == pytest.approx(n * (1 + 2 + 0.5))
    assert row[GPU_HOURS] == pytest.approx(n * (0.01 + 0.02 + 0.005))
    assert n > 4 and row["decidable"] == "no"
    # decidable once the grid has the seeds for every run, not before
    price |= {"nsgd": (0, 0, n), "psac": (0, 0, n), "flat": (0, 0, n - 1)}
    assert plan_claim(claim(combine="primary", primary="[np]*"), frame, cost)["decidable"] == "no"
    price["flat"] = (0, 0, n)
    assert plan_claim(claim(combine="primary", primary="[np]*"), frame, cost)["decidable"] == "yes"


def test_grid_cost_prices_a_run_with_the_job_cost_model_of_the_target_config():
    _, config, grid = checked_configs("test", None, [])
    cost = grid_cost(config, grid)
    wildcards = dict(dataset="duke", model="unet", clip="flat", morph="none", eps="200", seed="7")
    cpu, gpu, seeds = cost("seg", wildcards)
    prefix = "results/seg/duke/unet/flat/none/eps200/seed"
    jobs = [job for job in grid.jobs("seg") if job.path.startswith(prefix)]
    assert seeds == len(jobs) > 0
    hp = grid.params("seg", jobs[0].wc)
    train = predicted("seg_train", config, jobs[0].wc, hp)[1]
    assert cpu >= train > 0
    speedup = float(config["resources"]["gpu_speedup"])
    assert predicted("seg_train", config, jobs[0].wc, hp, gpu=True)[1] == pytest.approx(
        train / speedup
    )
    assert gpu == pytest.approx(cpu / speedup)
    # a cell outside the grid is priced with the study's defaults there, and has no seeds
    off = dict(wildcards, eps="123")
    assert cost("seg", off)[2] == 0 and cost("seg", off)[0] > 0


def test_the_command_prints_a_plan_per_registered_claim(tmp_path, capsys, monkeypatch):
    # the registry as this test writes it: the seg study registers seg-x and seg-y
    registry = [claim("less"), Claim(**{**vars(claim()), "id": "seg-y"})]
    monkeypatch.setattr(power, "registered_claims", lambda reader: registry)
    cell = "dataset duke, model unet, morph none, eps 200, clip nsgd"
    pairs(cell, with_sd(-0.1, 0.02)).to_csv(tmp_path / "claims_pairs.csv", index=False)
    assert power.main(["--pairs", str(tmp_path / "claims_pairs.csv"), "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(registry)  # header, rule, one row per claim
    seeds = cell_plan(claim("less"), pairs(cell, with_sd(-0.1, 0.02)), ALPHA)["seeds_needed"]
    assert lines[2].startswith(f"| seg | seg-x | {cell} |") and f"| {seeds} |" in lines[2]
    assert lines[3].startswith("| seg | seg-y |") and "| no pairs in this run |" in lines[3]
