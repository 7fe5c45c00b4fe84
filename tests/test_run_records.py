"""Per-run records: config.json in every run folder (the job's resolved hyperparameters), and
the optional TensorBoard events (`logging.tensorboard`), read back with protobuf."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import SEG_PARAMS, XCAL_PARAMS, xcal_processed
from tensorboardX.proto.event_pb2 import Event

import dpmed
from dpmed.errors import ConfigError
from dpmed.fets import outputs as fets_spec
from dpmed.fets import run as fets_run
from dpmed.runtime import RUN_CONFIG, JobContext
from dpmed.seg import outputs as seg_spec
from dpmed.seg import run as seg_run
from dpmed.tracking import TENSORBOARD_DIR, tracker
from dpmed.xcal import outputs as xcal_spec
from dpmed.xcal import run as xcal_run

SEG_WC = {"dataset": "duke", "model": "unet", "clip": "flat", "morph": "none", "eps": "50",
          "seed": "0"}  # fmt: skip
XCAL_WC = {"dataset": "bloodmnist", "model": "resnet18", "method": "static", "shift": "iid",
           "clients": "2", "eps": "5", "seed": "0"}  # fmt: skip
FETS_WC = {"aggregator": "fedavg", "dpmode": "none", "eps": "inf", "seed": "0"}
FETS_PARAMS = {
    "rounds": 2, "participation": 0.2, "selection": "sliding_window", "local_epochs": 1,
    "lr": 0.01, "batch_size": 4, "patch_size": [16, 16, 16], "patches_per_subject": 2,
    "timing_samples_per_subject": 40,
    "base_filters": 2, "depth": 2, "norm": "group", "clip_norm": 100.0, "delta": 1e-5,
    "simagg_distance": "l2", "sound_calibration": "analytic", "hd95": False,
}  # fmt: skip


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag → [(step, value)] of every scalar in the TFRecord event files under `folder`
    (record: u64 length, u32 crc, payload, u32 crc)."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def check_record(out: Path, study: str, wc: dict, params: dict, seed: int) -> None:
    """config.json holds exactly the job it ran: hp, study, wildcards, seed, device, versions."""
    record = json.loads((out / RUN_CONFIG).read_text())
    assert record["hyperparameters"] == json.loads(json.dumps(params))
    assert record["study"] == study and record["wildcards"] == wc and record["seed"] == seed
    assert record["device"] == {"requested": "cpu", "used": "cpu"} and record["threads"] == 1
    assert record["versions"]["dpmed"] == dpmed.__version__
    assert record["versions"]["torch"] == torch.__version__
    text = (out / RUN_CONFIG).read_text()
    assert text == json.dumps(record, indent=2, sort_keys=True) + "\n"


def check_events(out: Path, table: pd.DataFrame, step_key: str, tags: list[str]) -> None:
    """Every tag has one scalar per row of the run's history/rounds table, at its step."""
    scalars = read_scalars(out / TENSORBOARD_DIR)
    assert set(tags) <= set(scalars)
    for tag in tags:
        expected = [(int(s), float(v)) for s, v in zip(table[step_key], table[tag], strict=True)]
        got = sorted(scalars[tag])
        assert [s for s, _ in got] == [s for s, _ in expected], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6), tag


def test_every_study_lists_config_json_as_a_run_file():
    for spec in (seg_spec, fets_spec, xcal_spec):
        assert RUN_CONFIG in spec.RUN_FILES


def test_seg_run_records_its_config_and_logs_epochs(duke, tmp_path):
    params = SEG_PARAMS | {"epochs": 2}
    job = JobContext(duke, tmp_path, SEG_WC, params, 7, "cpu", 1, tensorboard=True)
    seg_run.run(job)
    check_record(tmp_path, "seg", SEG_WC, params, 7)
    history = pd.read_csv(tmp_path / seg_spec.HISTORY)
    check_events(tmp_path, history, "epoch", ["loss", "val_dice", "epsilon", "val_dice_c1"])


def test_xcal_run_records_its_config_and_logs_rounds(tmp_path):
    processed = xcal_processed(tmp_path / "data", [60, 10, 20])
    out = tmp_path / "run"
    job = JobContext(processed, out, XCAL_WC, XCAL_PARAMS, 3, "cpu", 1, tensorboard=True)
    xcal_run.run(job)
    check_record(out, "xcal", XCAL_WC, XCAL_PARAMS, 3)
    rounds = pd.read_csv(out / "rounds.csv")
    check_events(out, rounds, "round", ["f1", "accuracy", "epsilon", "road"])


def test_fets_run_records_its_config_and_logs_rounds(tmp_path):
    from test_fets_simulation import _processed

    processed = _processed(tmp_path / "data")
    out = tmp_path / "run"
    job = JobContext(processed, out, FETS_WC, FETS_PARAMS, 11, "cpu", 1, tensorboard=True)
    fets_run.run(job)
    check_record(out, "fets", FETS_WC, FETS_PARAMS, 11)
    rounds = pd.read_csv(out / "rounds.csv")
    assert list(rounds["round"]) == [0, 1, 2]  # round 0: the untrained model
    check_events(out, rounds, "round", ["dice_WT", "dice_mean_labels", "convergence_score"])
    # the declared outputs are what a run without tracking writes, byte for byte
    plain = tmp_path / "plain"
    fets_run.run(JobContext(processed, plain, FETS_WC, FETS_PARAMS, 11, "cpu", 1))
    assert not (plain / TENSORBOARD_DIR).exists()
    for name in ("rounds.csv", "selection.csv", "privacy.json", "model.pt", RUN_CONFIG):
        assert (plain / name).read_bytes() == (out / name).read_bytes(), name


def test_a_fresh_run_clears_old_events_and_a_resumed_one_purges_later_steps(tmp_path):
    with tracker(tmp_path, True, "epoch", 0) as board:
        for epoch in (1, 2, 3):
            board.log({"epoch": epoch, "loss": 10.0 + epoch, "epsilon": float("inf")})
    with tracker(tmp_path, True, "epoch", 0) as board:
        board.log({"epoch": 1, "loss": 1.0, "note": "text", "flag": True, "none": None})
    assert read_scalars(tmp_path / TENSORBOARD_DIR) == {"loss": [(1, 1.0)]}
    with tracker(tmp_path, True, "epoch", 1) as board:
        board.log({"epoch": 2, "loss": 2.0})
    files = sorted((tmp_path / TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    assert len(files) == 2
    purge = [Event.FromString(b) for b in _records(files[1])]
    assert any(e.session_log.status == e.session_log.START and e.step == 2 for e in purge)


def _records(path: Path) -> list[bytes]:
    data, at, out = path.read_bytes(), 0, []
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        out.append(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
    return out


def test_tracking_disabled_writes_nothing(tmp_path):
    with tracker(tmp_path, False, "round", 0) as board:
        board.log({"round": 1, "f1": 0.5})
    assert not (tmp_path / TENSORBOARD_DIR).exists()


def test_tensorboard_without_tensorboardx_names_the_config_key(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
    with pytest.raises(ConfigError) as err:
        with tracker(tmp_path, True, "round", 0):
            pass
    assert err.value.key == "logging.tensorboard"
