"""The fets federation end to end on tiny synthetic FeTS data: outputs, learning, resume, and a
toy aggregator registered for one test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import Killed, phase_kills, save_then_die

from dpmed.data import fets
from dpmed.data.synthetic import fets as synthetic_fets
from dpmed.fets import run as fets_run
from dpmed.fets.aggregation import aggregators
from dpmed.fets.aggregators import RULES, AggregationRule
from dpmed.fets.brats import subject_scores
from dpmed.fets.outputs import RUN_FILES
from dpmed.fets.report import table2
from dpmed.fets.round_clock import ConvergenceScore
from dpmed.fets.run import run
from dpmed.fets.spec import SPEC
from dpmed.runtime import JobContext

PARAMS = {
    "rounds": 3, "participation": 0.2, "selection": "sliding_window", "local_epochs": 1,
    "lr": 0.01, "batch_size": 4, "patch_size": [16, 16, 16], "patches_per_subject": 2,
    "timing_samples_per_subject": 40,
    "base_filters": 2, "depth": 2, "norm": "group", "clip_norm": 100.0, "delta": 1e-5,
    "simagg_distance": "l2", "sound_calibration": "analytic", "hd95": False,
}  # fmt: skip
WILDCARDS = {"aggregator": "dp_simagg", "dpmode": "paper", "eps": "10", "seed": "0"}


def _processed(root: Path, synthetic_seed: int = 0) -> Path:
    cfg = {"raw": "synthetic", "partitioning": "partitioning_2.csv", "val_fraction": 0.2,
           "split_seed": 0, "synthetic": {"shape": [24, 24, 16], "subjects_scale": 0.03,
                                          "seed": synthetic_seed}}  # fmt: skip
    synthetic_fets.generate(root / "raw", "fets", cfg, seed=synthetic_seed)
    fets.preprocess(root / "raw", root / "processed", "fets", cfg)
    return root / "processed"


@pytest.fixture(scope="module")
def processed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _processed(tmp_path_factory.mktemp("fets"))


def _job(processed: Path, out: Path, wildcards=WILDCARDS, params=PARAMS, seed=11) -> JobContext:
    return JobContext(processed, out, wildcards, params, seed, device="cpu", threads=1)


def test_subject_scores_by_hand():
    truth = np.array([0, 1, 2, 4, 4, 0])
    pred = np.array([0, 1, 1, 4, 0, 0])
    s = subject_scores(pred, truth, with_hd95=False)
    assert s["dice_label4"] == pytest.approx(2 * 1 / 3)  # |P|=1, |T|=2, overlap 1
    assert s["dice_label2"] == 0.0 and s["dice_label1"] == pytest.approx(2 / 3)
    assert s["dice_WT"] == pytest.approx(2 * 3 / (3 + 4))
    assert s["dice_TC"] == pytest.approx(2 * 2 / (3 + 3))
    empty = subject_scores(np.zeros(4, int), np.zeros(4, int), with_hd95=False)
    assert empty["dice_ET"] == 1.0  # both empty


def _assert_same_outputs(whole: Path, part: Path) -> None:
    for name in ("rounds.csv", "selection.csv", "metrics.json", "privacy.json", "model.pt"):
        assert (part / name).read_bytes() == (whole / name).read_bytes(), name
    assert not (part / "checkpoint.pt").exists()


KILLS = phase_kills(fets_run, "round", 2, "write_outputs")


@pytest.fixture(scope="module")
def whole(processed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run every killed one must end up equal to."""
    out = tmp_path_factory.mktemp("whole")
    run(_job(processed, out))
    return out


@pytest.mark.parametrize("phase", list(KILLS))
def test_killed_run_resumes_to_the_uninterrupted_result(processed, whole, tmp_path, phase):
    part = tmp_path / "part"
    with pytest.MonkeyPatch.context() as patch:
        KILLS[phase](patch)
        with pytest.raises(Killed):
            run(_job(processed, part))
    assert not (part / "model.pt").exists() and (part / "checkpoint.pt").exists()
    run(_job(processed, part))
    _assert_same_outputs(whole, part)
    assert json.loads((part / "resources.json").read_text())["attempts"] == 2
    # The checkpoint goes once the outputs exist: a rerun of a finished job starts afresh.
    run(_job(processed, part))
    assert json.loads((part / "resources.json").read_text())["attempts"] == 1
    assert (part / "rounds.csv").read_bytes() == (whole / "rounds.csv").read_bytes()


def test_a_checkpoint_on_other_data_is_not_resumed(processed, tmp_path, capsys):
    """Killed after round 2, the processed data regenerated with another synthetic seed,
    rerun: it equals a fresh run on the new data instead of resuming onto it."""
    new_data = _processed(tmp_path / "new", synthetic_seed=5)
    data = tmp_path / "data"
    shutil.copytree(processed, data)
    with pytest.MonkeyPatch.context() as patch:
        save_then_die(patch, "round", 2)
        with pytest.raises(Killed):
            run(_job(data, tmp_path / "part"))
    shutil.rmtree(data)
    shutil.copytree(new_data, data)
    run(_job(data, tmp_path / "part"))
    assert "not resumed because its input data changed" in capsys.readouterr().out
    run(_job(new_data, tmp_path / "fresh"))
    _assert_same_outputs(tmp_path / "fresh", tmp_path / "part")


def test_outputs_and_privacy_of_a_sound_run(processed, tmp_path):
    wc = {"aggregator": "dp_fedavg", "dpmode": "sound", "eps": "1", "seed": "0"}
    metrics = run(_job(processed, tmp_path, wc, seed=3))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(RUN_FILES)
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert rounds["round"].tolist() == [0, 1, 2, 3]
    assert (rounds["mechanisms"].iloc[1:] == 1).all()
    assert rounds["delta_f"].iloc[1] == pytest.approx(2 * 100.0 / 6)
    assert (rounds["sim_time_s"].diff().iloc[1:] > 0).all()
    # As in the FeTS challenge, round r's time is scored at the Dice of the model round r started
    # from (row r - 1, validated as the next round's first task); the final Dice is never scored.
    score = ConvergenceScore()
    started = zip(rounds["dice_mean_labels"].iloc[:-1], rounds["round_time_s"].iloc[1:],
                  strict=True)  # fmt: skip
    expected = [0.0, *(score.update(dice, t) for dice, t in started)]
    assert rounds["convergence_score"].tolist() == pytest.approx(expected, rel=1e-12, abs=0)
    assert metrics["convergence_score"] == rounds["convergence_score"].iloc[-1]
    priv = json.loads((tmp_path / "privacy.json").read_text())
    assert priv["guarantee"] == "dp" and priv["epsilon"] <= 3 * 1.0
    assert priv["epsilon"] == min(priv["epsilon_by_accountant"].values())
    sel = pd.read_csv(tmp_path / "selection.csv")
    assert sel.groupby("round").size().tolist() == [6, 6, 6]
    # A round lasts as long as its slowest collaborator (trainers are among the slowest).
    per_round = sel.groupby("round")["sim_time_s"].max().to_numpy()
    assert (per_round <= rounds["round_time_s"].iloc[1:].to_numpy() + 1e-9).all()
    assert (sel["sim_time_s"] >= 3.0).all()  # download + validation + ... each at least 1 s
    resources = json.loads((tmp_path / "resources.json").read_text())
    assert resources["energy_method"].startswith("estimate") and resources["peak_rss_mb"] > 0
    assert metrics["n_parameters"] > 0 and metrics["guarantee"] == "dp"


def test_hd95_rules_and_value():
    a = np.zeros((12, 12, 12), dtype=bool)
    a[2:5, 2:5, 2:5] = True
    b = np.zeros_like(a)
    b[2:5, 2:5, 6:9] = True  # the same cube shifted by 4 voxels along z
    scores = subject_scores(np.where(a, 4, 0), np.where(b, 4, 0), with_hd95=True)
    # Each cube has 26 surface voxels: faces 9 at distance 2 and 9 at 4, ring 8 at 3, per
    # direction; the pooled 95th percentile (rank 0.95·51 = 48.45) is among the fours.
    assert scores["hd95_ET"] == pytest.approx(4.0)
    assert (scores["hd95_empty_ET"], scores["hd95_both_empty_ET"]) == (0.0, 0.0)
    empty = subject_scores(np.zeros_like(a, int), np.where(b, 4, 0), with_hd95=True)
    assert empty["hd95_WT"] == pytest.approx(np.linalg.norm(a.shape))
    assert (empty["hd95_empty_WT"], empty["hd95_both_empty_WT"]) == (1.0, 0.0)
    none = subject_scores(np.zeros_like(a, int), np.zeros_like(a, int), with_hd95=True)
    assert none["hd95_TC"] == 0.0
    assert (none["hd95_empty_TC"], none["hd95_both_empty_TC"]) == (0.0, 1.0)


def test_hd95_is_the_pooled_percentile_in_3d():
    """A cube and the same cube with a 1-voxel spur: pooled 95th percentile (Eq. (3)), not the
    larger one-way 95th percentile MONAI gives."""
    a = np.zeros((12, 12, 16), dtype=bool)
    a[3:6, 3:6, 3:6] = True  # 26 surface voxels
    b = a.copy()
    b[4, 4, 6:10] = True  # spur: (4, 4, 5) becomes interior of b
    # a → b: 25 shared surface voxels at 0, (4, 4, 5) at 1. b → a: 25 at 0, spur 1, 2, 3, 4.
    # Pooled, sorted: 50 zeros, 1, 1, 2, 3, 4; rank 0.95·54 = 51.3 → 1 + 0.3·(2 − 1).
    scores = subject_scores(np.where(b, 1, 0), np.where(a, 1, 0), with_hd95=True)
    assert scores["hd95_TC"] == pytest.approx(1.3)  # directed max: rank 0.95·28 = 26.6 → 2.6


def test_hd95_reaches_metrics_and_table_ii(processed, tmp_path):
    folder = tmp_path / SPEC.path.format(**WILDCARDS)
    metrics = run(_job(processed, folder, params=dict(PARAMS, rounds=1, hd95=True)))
    for region in ("ET", "TC", "WT"):
        assert metrics[f"hd95_{region}"] >= 0.0
        one, both = metrics[f"hd95_empty_{region}"], metrics[f"hd95_both_empty_{region}"]
        assert 0.0 <= one <= 1.0 and 0.0 <= both <= 1.0 and one + both <= 1.0
    table = table2([folder], tmp_path / "table2.csv")
    assert table.loc[0, "hd95_WT_mean"] == pytest.approx(metrics["hd95_WT"])


def test_a_registered_toy_aggregator_runs_end_to_end(processed, tmp_path, monkeypatch):
    """A coordinate-wise median registered for this test only: grid validity, server, privacy
    record and report all take it from the registry."""

    def median_rule(local, tensor_name, cfg):
        return np.median(np.stack([t.tensor for t in local]), axis=0).astype(local[0].tensor.dtype)

    RULES.add("median", AggregationRule("Median", 5, aggregate=median_rule))
    try:
        # Patterns are built when the spec is imported; a toy entry extends them by hand.
        monkeypatch.setitem(SPEC.patterns, "aggregator", aggregators().pattern())
        wc = {"aggregator": "median", "dpmode": "none", "eps": "inf", "seed": "0"}
        assert SPEC.invalid(wc) is None
        assert SPEC.invalid({**wc, "dpmode": "sound", "eps": "1"}) is not None
        folder = tmp_path / SPEC.path.format(**wc)
        metrics = run(_job(processed, folder, wc, dict(PARAMS, rounds=1), seed=2))
        assert metrics["aggregator"] == "median" and metrics["guarantee"] == "none"
        privacy = json.loads((folder / "privacy.json").read_text())
        assert privacy["mechanism"] == "none (median, no noise)"
        assert table2([folder], tmp_path / "table2.csv")["method"].tolist() == ["Median"]
    finally:
        RULES.remove("median")
    assert "median" not in aggregators()
