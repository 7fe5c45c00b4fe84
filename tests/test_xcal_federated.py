"""XCal-FL loop: FedAvg, partitions as the clients see them, learning, privacy, model.pt and
resume (same job only, including a run stopped after its last round)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import XCAL_PARAMS, xcal_processed

from dpmed.data.partition import apply_brightness, dirichlet_counts
from dpmed.models import load_model
from dpmed.runtime import JobContext
from dpmed.xcal import federation as xcal_fed
from dpmed.xcal import run as xcal_module
from dpmed.xcal.client import ClientUpdate
from dpmed.xcal.federation import fedavg
from dpmed.xcal.run import run
from dpmed.xcal.shifts import partition

PARAMS = dict(XCAL_PARAMS)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("xcal_small"), [120, 20, 40])


def run_xcal(processed: Path, out: Path, wc: dict[str, str], params: dict) -> dict:
    """One job through the runner, on the CPU with one thread, job seed 0."""
    return run(JobContext(processed, out, wc, params, seed=0, device="cpu", threads=1))


def _same_weights(a: Path, b: Path) -> bool:
    one, two = load_model(a / "model.pt").state_dict(), load_model(b / "model.pt").state_dict()
    return one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


def _wc(method: str, eps: str, clients: str = "3", shift: str = "iid") -> dict[str, str]:
    return {
        "dataset": "bloodmnist",
        "model": "resnet18",
        "method": method,
        "shift": shift,
        "clients": clients,
        "eps": eps,
        "seed": "0",
    }


def test_fedavg_weights_by_sample_count():
    a = ClientUpdate({"w": torch.tensor([1.0, 2.0])}, 10, {})
    b = ClientUpdate({"w": torch.tensor([4.0, -1.0])}, 30, {})
    torch.testing.assert_close(fedavg([a, b])["w"], torch.tensor([3.25, -0.25]))


def test_label_shift_clients_follow_the_dirichlet_draw():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 300)
    images = np.arange(300, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 2, 1), np.uint8)
    parts = partition(images, labels, "label", 5, PARAMS, seed=11)
    # Independent redraw in the documented order: per-class shuffles, then per-class Dirichlet.
    redraw = np.random.default_rng(11)
    for c in range(4):
        redraw.permutation(np.flatnonzero(labels == c))
    proportions = np.stack([redraw.dirichlet(np.full(5, 0.5)) for _ in range(4)])
    expected = dirichlet_counts(proportions, np.bincount(labels, minlength=4))
    got = np.stack([np.bincount(lab, minlength=4) for _, lab in parts], axis=1)
    np.testing.assert_array_equal(got, expected)
    assert sum(len(lab) for _, lab in parts) == 300


def test_covariate_shift_applies_the_configured_brightness():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (30, 4, 4, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, 30)
    parts = partition(images, labels, "covariate", 3, {**PARAMS, "brightness": [0.5, 1.5]}, seed=2)
    iid = partition(images, labels, "iid", 3, PARAMS, seed=2)  # the same index draw
    assert any(not np.array_equal(a, b) for (a, _), (b, _) in zip(parts, iid, strict=True))
    for (shifted, _), (plain, _), factor in zip(parts, iid, [0.5, 1.0, 1.5], strict=True):
        np.testing.assert_array_equal(shifted, apply_brightness(plain, factor))


def test_nondp_federated_learning_is_clearly_above_chance(tmp_path):
    """3 IID clients × 10 rounds × 2 local epochs on 300 synthetic BloodMNIST images at 28²
    with the tiny smoke ResNet: macro F1 0.42, the last five rounds 0.39 against 0.17 for the
    first five (with one local epoch a round, 0.16: too few steps to tell)."""
    processed = xcal_processed(tmp_path / "data", [300, 40, 200])
    params = {
        **PARAMS,
        "rounds": 10,
        "local_epochs": 2,
        "batch_size": 32,
        "road_every": 100,
        "road_subsample": 4,
    }
    metrics = run_xcal(processed, tmp_path / "run", _wc("nondp", "inf"), params)
    # 8 classes: a constant prediction has macro F1 ≈ 0.04, a uniform random guess ≈ 0.11.
    assert metrics["f1"] > 0.2
    assert metrics["epsilon"] is None
    f1 = pd.read_csv(tmp_path / "run" / "rounds.csv")["f1"]
    assert f1.iloc[-5:].mean() > f1.iloc[:5].mean() + 0.08


@pytest.mark.parametrize(
    ("method", "eps"), [("xcal", "2"), ("static", "2"), ("agp", "2"), ("agp-dp", "2")]
)
def test_private_runs_stay_within_the_target_and_write_every_output(small, tmp_path, method, eps):
    out = tmp_path / method
    run_xcal(small, out, _wc(method, eps), PARAMS)
    privacy = json.loads((out / "privacy.json").read_text())
    if method == "agp":  # no noise on the protected channels: the paper's ε, not a bound
        assert privacy["guarantee"] == "paper-approximation"
        assert any("finding 10" in reason for reason in privacy["reasons"])
        assert set(privacy["epsilon_by_accountant"]) == {"rdp_noised_channels"}
    else:
        assert privacy["guarantee"] == "dp"
    assert privacy["sampling"] == "poisson"
    assert 0 < privacy["epsilon"] <= 2.0
    assert privacy["epsilon"] == pytest.approx(max(privacy["extra"]["client_epsilon"]))
    rounds = pd.read_csv(out / "rounds.csv")
    assert list(rounds["round"]) == [1, 2]
    assert rounds["epsilon"].is_monotonic_increasing and rounds["epsilon"].iloc[-1] <= 2.0
    road = json.loads((out / "road.json").read_text())
    assert len(road["morf"]) == len(road["lerf"]) == 2 and road["subsample"] == 6
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["road"] == pytest.approx(road["road"])  # the paper's ROAD, %
    assert rounds["road"].iloc[-1] == pytest.approx(road["road"])
    assert metrics["road_combined"] == pytest.approx(road["combined"])
    assert metrics["road_random"] == pytest.approx(road["random"]["road"])  # the baseline
    assert len(road["random"]["morf_drop"]) == 2 and road["random"]["road"] != road["road"]
    d_road, d_eps = rounds["road"].diff().iloc[-1], rounds["eps_spent"].diff().iloc[-1]
    if d_eps > 0:  # ΔROAD/Δε of the paper's ROAD (%) over spent ε; None where it did not grow
        assert metrics["road_per_eps"] == pytest.approx(d_road / d_eps)
    else:
        assert metrics["road_per_eps"] is None
    assert not (out / "checkpoint.pt").exists()
    assert load_model(out / "model.pt").fc.out_features == 8  # the final global ResNet-18
    if method == "xcal":
        extra = privacy["extra"]
        for s, g, realised, bound, scale in zip(
            extra["client_eps_realised_signal"],
            extra["client_eps_realised_gradient"],
            extra["client_eps_realised_reading"],
            extra["client_epsilon"],
            extra["client_calibration_scale"],
            strict=True,
        ):
            # each share within its part of the calibration budget scale·ε
            assert s <= 0.1 * scale * 2.0 + 1e-9 and g <= 0.9 * scale * 2.0 + 1e-9
            assert realised <= min(bound, s + g) + 1e-9
        ref = extra["client_sigma_ref"]
        assert metrics["sigma_min"] >= 0.8 * min(ref) - 1e-9
        assert metrics["sigma_max"] <= 1.2 * max(ref) + 1e-9


def _dies_in_round_two(monkeypatch) -> None:
    original, calls = xcal_fed.xcal_eval.Evaluation.scores, {"n": 0}

    def dies(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return original(*args, **kwargs)

    monkeypatch.setattr(xcal_fed.xcal_eval.Evaluation, "scores", dies)


def test_a_killed_run_resumes_to_the_same_result(small, tmp_path, monkeypatch):
    wc = _wc("xcal-logit", "3", shift="label")
    run_xcal(small, tmp_path / "fresh", wc, PARAMS)
    with monkeypatch.context() as patch:
        _dies_in_round_two(patch)
        with pytest.raises(KeyboardInterrupt):
            run_xcal(small, tmp_path / "resumed", wc, PARAMS)
    assert (tmp_path / "resumed" / "checkpoint.pt").exists()
    run_xcal(small, tmp_path / "resumed", wc, PARAMS)
    cols = ["round", "f1", "accuracy", "epsilon", "road"]
    fresh = pd.read_csv(tmp_path / "fresh" / "rounds.csv")[cols]
    resumed = pd.read_csv(tmp_path / "resumed" / "rounds.csv")[cols]
    pd.testing.assert_frame_equal(fresh, resumed)
    for name in ("privacy.json", "road.json"):
        assert (tmp_path / "fresh" / name).read_text() == (tmp_path / "resumed" / name).read_text()
    assert _same_weights(tmp_path / "fresh", tmp_path / "resumed")


def test_a_checkpoint_of_another_configuration_is_not_resumed(small, tmp_path, monkeypatch):
    """Killed after round 1 with lr A, rerun with lr B: the rerun starts afresh, so it equals
    a fresh lr-B run (resuming would have kept round 1 trained at lr A)."""
    wc, params_b = _wc("static", "3"), {**PARAMS, "lr": 0.05}
    run_xcal(small, tmp_path / "fresh", wc, params_b)
    with monkeypatch.context() as patch:
        _dies_in_round_two(patch)
        with pytest.raises(KeyboardInterrupt):
            run_xcal(small, tmp_path / "rerun", wc, PARAMS)
    assert (tmp_path / "rerun" / "checkpoint.pt").exists()
    run_xcal(small, tmp_path / "rerun", wc, params_b)
    cols = ["round", "f1", "accuracy", "epsilon", "road"]
    fresh = pd.read_csv(tmp_path / "fresh" / "rounds.csv")[cols]
    pd.testing.assert_frame_equal(fresh, pd.read_csv(tmp_path / "rerun" / "rounds.csv")[cols])
    assert _same_weights(tmp_path / "fresh", tmp_path / "rerun")
    assert not (tmp_path / "rerun" / "checkpoint.pt").exists()


def test_a_run_stopped_after_its_last_round_evaluates_the_trained_weights(
    small, tmp_path, monkeypatch
):
    """The checkpoint of the last round exists but no output does: the rerun trains nothing
    and must evaluate the checkpointed weights, not the initial network."""
    wc = _wc("agp", "3")
    run_xcal(small, tmp_path / "fresh", wc, PARAMS)
    original = xcal_module.write_outputs

    def dies(*args, **kwargs):
        raise KeyboardInterrupt("killed before the outputs")

    monkeypatch.setattr(xcal_module, "write_outputs", dies)
    with pytest.raises(KeyboardInterrupt):
        run_xcal(small, tmp_path / "stopped", wc, PARAMS)
    assert not (tmp_path / "stopped" / "metrics.json").exists()
    monkeypatch.setattr(xcal_module, "write_outputs", original)
    monkeypatch.setattr(xcal_module, "train_round", None)  # nothing left to train
    run_xcal(small, tmp_path / "stopped", wc, PARAMS)
    for name in ("road.json", "gradcam.npz", "privacy.json"):
        fresh, stopped = tmp_path / "fresh" / name, tmp_path / "stopped" / name
        assert fresh.read_bytes() == stopped.read_bytes(), name
    assert _same_weights(tmp_path / "fresh", tmp_path / "stopped")


def _same_outputs(fresh: Path, other: Path) -> None:
    cols = ["round", "f1", "accuracy", "epsilon", "road"]
    rounds = [pd.read_csv(d / "rounds.csv")[cols] for d in (fresh, other)]
    pd.testing.assert_frame_equal(*rounds)
    for name in ("road.json", "gradcam.npz", "privacy.json", "model.pt"):
        assert (fresh / name).read_bytes() == (other / name).read_bytes(), name
    assert not (other / "checkpoint.pt").exists()


def test_a_run_killed_between_its_outputs_resumes_to_the_same_result(small, tmp_path, monkeypatch):
    wc = _wc("xcal-logit", "3")
    run_xcal(small, tmp_path / "fresh", wc, PARAMS)

    def dies(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing the outputs")

    with monkeypatch.context() as patch:
        patch.setattr(xcal_fed, "save_model", dies)
        with pytest.raises(KeyboardInterrupt):
            run_xcal(small, tmp_path / "stopped", wc, PARAMS)
    assert (tmp_path / "stopped" / "privacy.json").exists()
    run_xcal(small, tmp_path / "stopped", wc, PARAMS)
    _same_outputs(tmp_path / "fresh", tmp_path / "stopped")


def test_a_checkpoint_on_other_data_is_not_resumed(small, tmp_path, monkeypatch, capsys):
    """Killed in round 2, the processed data replaced by another draw, rerun: it equals a
    fresh run on the new data (resuming would keep round 1 trained on the old data)."""
    other = xcal_processed(tmp_path / "other", [120, 20, 40], seed=3)
    data = tmp_path / "data"
    shutil.copytree(small, data)
    wc = _wc("static", "3")
    with monkeypatch.context() as patch:
        _dies_in_round_two(patch)
        with pytest.raises(KeyboardInterrupt):
            run_xcal(data, tmp_path / "rerun", wc, PARAMS)
    shutil.rmtree(data)
    shutil.copytree(other, data)
    run_xcal(data, tmp_path / "rerun", wc, PARAMS)
    assert "not resumed because its input data changed" in capsys.readouterr().out
    run_xcal(other, tmp_path / "fresh", wc, PARAMS)
    _same_outputs(tmp_path / "fresh", tmp_path / "rerun")


def test_efficiency_is_the_slope_between_the_first_and_last_defined_rounds():
    assert xcal_module.efficiency([0.2, None, 0.5], [1.0, 2.0, 4.0]) == pytest.approx(0.1)
    assert xcal_module.efficiency([0.2, 0.3], [None, None]) is None  # non-private
    assert xcal_module.efficiency([0.2, 0.3], [2.0, 2.0]) is None  # no ε spent in between


def test_efficiency_is_undefined_when_epsilon_moved_only_by_round_off():
    """Demo dermamnist label-skew c3: one client spent its budget in round 1, so the max ε read
    4.9999974 then 4.9999981 and the old slope reported ΔF1/Δε = −32904."""
    f1, eps = [0.1364, 0.0355, 0.1126], [4.999997365, 4.999997365, 4.999998090]
    assert xcal_module.efficiency(f1, eps) is None
    assert xcal_module.efficiency([0.1, 0.2], [4.9, 5.0]) == pytest.approx(1.0)
