"""Paper 000's claims (`dpmed.fets.claims`) read from hand-written fets run files: pairing by
seed within a DP mode, the equivalence margins, the scale floor and the measured table."""

from __future__ import annotations

import json
import math

import pytest

from dpmed.fets.claims import EQUIVALENT_COST, fets_observations
from dpmed.report.claims import claims_tables


def _run(root, cell: str, seed: int, dice: float, seconds: float) -> tuple[str, str]:
    folder = root / "results" / "fets" / cell / f"seed{seed}"
    folder.mkdir(parents=True)
    metrics = {f"dice_{r}": dice for r in ("ET", "TC", "WT")}
    metrics |= {"convergence_score": dice, "dice_WT_round0": 0.01}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    resources = {"wall_clock_s": seconds, "peak_rss_mb": 500.0, "peak_gpu_mem_mb": None}
    (folder / "resources.json").write_text(json.dumps(resources))
    return str(folder / "metrics.json"), str(folder / "resources.json")


def test_fets_claims_pair_by_seed_per_dp_mode(tmp_path):
    runs = []
    for seed, shift in enumerate([0.001, -0.002, 0.0015]):
        runs.append(_run(tmp_path, "simagg/none/epsinf", seed, 0.70, 100.0))
        runs.append(_run(tmp_path, "dp_simagg/paper/eps10", seed, 0.70 + shift, 101.0 + seed))
        runs.append(_run(tmp_path, "dp_simagg/sound/eps10", seed, 0.30 + shift, 150.0 + seed))
        runs.append(_run(tmp_path, "fedavg/none/epsinf", seed, 0.05, 100.0))
        runs.append(_run(tmp_path, "dp_fedavg/sound/eps10", seed, 0.20, 100.0))
    runs.append(_run(tmp_path, "dp_simagg-rho0.2/paper/eps10", 0, 0.0, 1.0))  # swept: not read
    metrics, resources = (list(paths) for paths in zip(*runs, strict=True))
    claims, frame = fets_observations(metrics, resources)
    table, measured = claims_tables({"fets": (claims, frame)})
    rows = table.set_index(["claim", "cell"])
    matches = rows.loc["fets-dp10-matches-simagg-dice"]
    paper = matches.loc["region WT, aggregator dp_simagg, dpmode paper, eps 10"]
    sound = matches.loc["region WT, aggregator dp_simagg, dpmode sound, eps 10"]
    assert paper["n_seeds"] == 3 and paper["diff_mean"] == pytest.approx(0.0005 / 3)
    assert paper["verdict"] == "supported" and sound["verdict"] == "contradicted"
    # FedAvg's Dice 0.05 < SimAgg's 0.70: the scale floor needs both arms below it
    simagg = rows.loc[("fets-simagg-above-fedavg-dice", "region ET, aggregator simagg, "
                       "dpmode none, eps inf")]  # fmt: skip
    assert simagg["diff_mean"] == pytest.approx(0.65) and "neither arm" not in simagg["reason"]
    # DP-SimAgg ε0 = 10 against non-private FedAvg, per DP mode: 0.70 + shift and 0.30 + shift
    # against 0.05 in every seed
    fedavg = rows.loc["fets-dp10-above-fedavg-dice"]
    for mode, level in (("paper", 0.70), ("sound", 0.30)):
        row = fedavg.loc[f"region TC, aggregator dp_simagg, dpmode {mode}, eps 10"]
        assert row["n_seeds"] == 3 and row["diff_mean"] == pytest.approx(level - 0.05 + 0.0005 / 3)
        assert row["verdict"] == "supported"
    score = rows.loc["fets-dp10-above-fedavg-score"]
    assert list(score.index) == [
        f"aggregator dp_simagg, dpmode {m}, eps 10" for m in ("paper", "sound")
    ]
    assert rows.loc["fets-dp1-learns"]["reason"].iloc[0].startswith("cells absent")
    # time: DP paper 1-3 % slower, within ±5 %; sound 50 % slower
    time = measured.set_index(["claim", "cell"]).loc["fets-dp-time-equals-simagg"]
    assert time["margin"].iloc[0] == pytest.approx(EQUIVALENT_COST)
    paper_time = time.loc["aggregator dp_simagg, dpmode paper, eps 10"]
    assert paper_time["diff_mean"] == pytest.approx(math.log(1.02), abs=1e-4)
    assert paper_time["verdict"] == "supported"
    assert time.loc["aggregator dp_simagg, dpmode sound, eps 10", "verdict"] == "contradicted"


def test_fets_dice_below_the_floor_in_both_arms_is_inconclusive(tmp_path):
    runs = [
        _run(tmp_path, cell, seed, dice, 10.0)
        for seed in range(3)
        for cell, dice in (("simagg/none/epsinf", 0.03), ("fedavg/none/epsinf", 0.01))
    ]
    claims, frame = fets_observations(*(list(p) for p in zip(*runs, strict=True)))
    table, _ = claims_tables({"fets": (claims, frame)})
    dice = table[table["claim"] == "fets-simagg-above-fedavg-dice"]
    assert len(dice) == 3 and (dice["verdict"] == "inconclusive").all()
    assert dice["reason"].str.startswith("neither arm learned").all()
