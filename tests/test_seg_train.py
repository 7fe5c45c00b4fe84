"""seg training end to end in-process on synthetic Duke: learning signal, privacy record,
resume after a kill gives the same result as an uninterrupted run. `train` is the seg runner
(`dpmed.seg.run.run`) on a CPU JobContext; other seg tests import it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import SEG_PARAMS, Killed, phase_kills, save_then_die, unit_duke_config

from dpmed.checkpoint import CHECKPOINT
from dpmed.data.stage import preprocess, synthesize
from dpmed.errors import ConfigError
from dpmed.runtime import JobContext
from dpmed.seg import run as seg_run
from dpmed.seg.data import load_seg_data
from dpmed.seg.run import run

PARAMS = SEG_PARAMS


def job(processed, out, wc, params, seed=0) -> JobContext:
    """A one-thread CPU seg job."""
    return JobContext(Path(processed), Path(out), dict(wc), dict(params), seed, "cpu", 1)


def train(processed, out, wc, params, seed=0) -> dict:
    """Run (or resume) one seg job; its metrics."""
    return run(job(processed, out, wc, params, seed))


def wildcards(**kw: str) -> dict[str, str]:
    wc = dict(dataset="duke", model="unet", clip="none", morph="none", eps="inf", seed="0")
    return wc | kw


def test_non_private_unet_learns_beyond_all_background(duke, tmp_path):
    data = load_seg_data(duke, "duke")
    test = data.splits["test"]
    # an all-background prediction has Dice 0 on every layer present in the ground truth
    assert all(bool((test.masks == c).any()) for c in data.eval_classes)
    params = PARAMS | {"epochs": 25, "lr": 0.01, "batch_size": 4}
    metrics = train(duke, tmp_path, wildcards(), params, 0)
    assert metrics["dice"] > 0.5  # measured ≈ 0.7 (all-background: 0)
    history = pd.read_csv(tmp_path / "diagnostics/history.csv")
    assert list(history["epoch"]) == list(range(1, 26))
    assert history["loss"].iloc[-1] < history["loss"].iloc[0]
    assert set(history.columns) >= {"loss", "val_dice", "epsilon", "seconds"}
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert privacy["guarantee"] == "none" and privacy["epsilon"] is None
    assert not (tmp_path / CHECKPOINT).exists()
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert state["model"] == "unet" and state["arguments"]["n_classes"] == 9


def test_private_run_records_both_accountants_within_target(duke, tmp_path):
    metrics = train(duke, tmp_path, wildcards(clip="psac", eps="20"), PARAMS, 0)
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert privacy["guarantee"] == "dp" and privacy["sampling"] == "poisson"
    assert privacy["epsilon"] <= 20 + 0.01
    assert set(privacy["epsilon_by_accountant"]) == {"rdp", "prv"}
    assert privacy["epsilon_by_accountant"]["prv"] <= 20 + 0.5
    n_train = metrics["n_train"]
    assert privacy["sample_rate"] == pytest.approx(8 / n_train)
    assert privacy["steps"] == PARAMS["epochs"] * int(n_train / 8)
    history = pd.read_csv(tmp_path / "diagnostics/history.csv")
    assert history["epsilon"].is_monotonic_increasing
    assert history["epsilon"].iloc[-1] == pytest.approx(privacy["epsilon"])


def test_adaptive_batch_scope_is_labelled_and_logged(duke, tmp_path):
    train(
        duke,
        tmp_path,
        wildcards(model="unetpp", clip="flat", morph="adaptive-v2", eps="50"),
        PARAMS,
    )
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert privacy["guarantee"] == "paper-approximation" and privacy["reasons"]
    log = pd.read_csv(tmp_path / "diagnostics/morph_log.csv")
    assert sorted(set(log["epoch"])) == [1, 2] and sorted(set(log["class"])) == list(range(1, 8))
    shares = log[["share_open", "share_close", "share_both"]].sum(axis=1)
    assert shares.to_numpy() == pytest.approx(1.0)
    assert "open" not in set(log["operation"])  # v2: thick layers get both, never opening


def test_adaptive_per_image_scope_is_dp(duke, tmp_path):
    wc = wildcards(model="unet", clip="flat", morph="adaptive-v2-s", eps="50")
    train(duke, tmp_path, wc, PARAMS | {"epochs": 1}, 0)
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert privacy["guarantee"] == "dp" and privacy["reasons"] == []
    assert len(pd.read_csv(tmp_path / "diagnostics/morph_log.csv")) > 0


def _assert_same_outputs(ref: Path, run_dir: Path) -> None:
    """Every output of the resumed run equals the uninterrupted one (seconds aside)."""
    a, b = (
        json.loads((ref / "metrics.json").read_text()),
        json.loads((run_dir / "metrics.json").read_text()),
    )
    a.pop("train_seconds"), b.pop("train_seconds")
    assert a == b
    for name in (
        "privacy.json",
        "model.pt",
        "diagnostics/morph_log.csv",
        "diagnostics/alignment.csv",
    ):
        assert (ref / name).read_bytes() == (run_dir / name).read_bytes(), name
    history = [
        pd.read_csv(d / "diagnostics/history.csv").drop(columns="seconds") for d in (ref, run_dir)
    ]
    pd.testing.assert_frame_equal(*history)
    assert not (run_dir / CHECKPOINT).exists()


KILLS = phase_kills(seg_run, "epoch", 2, "final_metrics")


@pytest.mark.parametrize("phase", list(KILLS))
def test_a_run_killed_at_a_phase_boundary_resumes_to_the_same_result(duke, tmp_path, phase):
    wc = wildcards(clip="flat", eps="30", morph="adaptive-v1")
    params = PARAMS | {"epochs": 3}
    train(duke, tmp_path / "ref", wc, params, 5)
    with pytest.MonkeyPatch.context() as patch:
        KILLS[phase](patch)
        with pytest.raises(Killed):
            train(duke, tmp_path / "run", wc, params, 5)
    assert (tmp_path / "run" / CHECKPOINT).exists()
    train(duke, tmp_path / "run", wc, params, 5)
    _assert_same_outputs(tmp_path / "ref", tmp_path / "run")


def test_checkpoint_of_another_configuration_is_not_resumed(duke, tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        save_then_die(patch, "epoch")
        with pytest.raises(Killed):
            train(duke, tmp_path, wildcards(), PARAMS, 0)
    train(duke, tmp_path, wildcards(), PARAMS | {"lr": 0.002}, 0)
    assert len(pd.read_csv(tmp_path / "diagnostics/history.csv")) == 2


def test_a_checkpoint_on_other_data_is_not_resumed(duke, tmp_path, capsys):
    """Killed after epoch 1, the processed data replaced (another synthetic seed), rerun: the
    rerun equals a fresh run on the new data (resuming would keep epoch 1 of the old data)."""
    cfg = unit_duke_config()
    cfg["synthetic"] = cfg["synthetic"] | {"seed": 7}
    synthesize("duke", cfg, tmp_path / "raw_b")
    preprocess("duke", cfg, tmp_path / "raw_b", tmp_path / "new_data")
    data = tmp_path / "data"
    shutil.copytree(duke, data)
    wc, params = wildcards(clip="flat", eps="30"), PARAMS | {"epochs": 2}
    with pytest.MonkeyPatch.context() as patch:
        save_then_die(patch, "epoch", 1)
        with pytest.raises(Killed):
            train(data, tmp_path / "run", wc, params, 5)
    shutil.rmtree(data)
    shutil.copytree(tmp_path / "new_data", data)
    train(data, tmp_path / "run", wc, params, 5)
    assert "not resumed because its input data changed" in capsys.readouterr().out
    train(tmp_path / "new_data", tmp_path / "fresh", wc, params, 5)
    _assert_same_outputs(tmp_path / "fresh", tmp_path / "run")


def test_sweep_suffix_of_the_clip_wildcard_names_the_rule(duke, tmp_path):
    params = PARAMS | {"epochs": 1, "clip_norm": 0.5, "lr": 0.001}
    train(duke, tmp_path, wildcards(clip="flat-C0.5-lr0.001", eps="20"), params, 0)
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert privacy["extra"]["clip_rule"] == "flat" and privacy["clip_norm"] == 0.5


def test_adaptive_morph_needs_the_retinal_dataset(duke, tmp_path):
    with pytest.raises(ConfigError, match="retinal layers of duke"):
        train(
            duke,
            tmp_path,
            wildcards(dataset="umn", morph="adaptive-v1", clip="flat", eps="8"),
            PARAMS,
        )


def test_non_private_with_clip_rule_is_rejected(duke, tmp_path):
    with pytest.raises(Exception, match="eps"):
        train(duke, tmp_path, wildcards(clip="flat", eps="inf"), PARAMS, 0)
    assert not math.isnan(PARAMS["lr"])
