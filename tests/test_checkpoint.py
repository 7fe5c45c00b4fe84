"""The shared checkpoint module: plain-tensor files only (a planted pickle never runs),
identical bytes for identical states, and an identity (job, data, code) that a resume must
match. The studies' resume-after-kill tests sit beside each study."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import dpmed
from dpmed import checkpoint as ckpt
from dpmed.checkpoint import CHECKPOINT, Checkpoint, JobIdentity, job_identity
from dpmed.errors import DataFormatError
from dpmed.models import build_model, load_model, save_model


class Payload:
    """Unpickling this creates `marker`: stands for arbitrary code in a crafted file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(path: Path, marker: Path, extra: dict) -> None:
    torch.save({**extra, "payload": Payload(marker)}, path)


def test_the_planted_payload_runs_when_unpickled(tmp_path):
    """What the guard is against: the crafted file runs code under a plain `torch.load`."""
    _plant(tmp_path / "x.pt", tmp_path / "ran", {})
    torch.load(tmp_path / "x.pt", weights_only=False)
    assert (tmp_path / "ran").exists()


def test_a_pickle_payload_in_checkpoint_pt_is_refused_without_running(tmp_path, capsys):
    identity = JobIdentity("j", "d", "c")
    _plant(tmp_path / CHECKPOINT, tmp_path / "ran", {"identity": {"job": "j", "data": "d",
                                                                   "code": "c"}})  # fmt: skip
    assert Checkpoint(tmp_path / CHECKPOINT, identity).load() is None
    assert not (tmp_path / "ran").exists()
    assert "refused to load" in capsys.readouterr().out


def test_a_pickle_payload_in_model_pt_is_refused_without_running(tmp_path):
    net = build_model("unet", in_channels=1, n_classes=2, width=4, depth=2)
    _plant(tmp_path / "model.pt", tmp_path / "ran", {"model": "unet", "arguments": {},
                                                      "state_dict": net.state_dict()})  # fmt: skip
    with pytest.raises(DataFormatError, match="model.pt.*refused"):
        load_model(tmp_path / "model.pt")
    assert not (tmp_path / "ran").exists()


def test_model_pt_bytes_are_identical_for_identical_weights(tmp_path):
    arguments = {"in_channels": 1, "n_classes": 2, "width": 4, "depth": 2}
    nets = []
    for _ in range(2):
        torch.manual_seed(3)
        nets.append(build_model("unet", **arguments))
    save_model(tmp_path / "a" / "model.pt", "unet", arguments, nets[0])
    save_model(tmp_path / "b" / "model.pt", "unet", arguments, nets[1])
    assert (tmp_path / "a" / "model.pt").read_bytes() == (tmp_path / "b" / "model.pt").read_bytes()
    loaded = load_model(tmp_path / "a" / "model.pt")
    assert all(torch.equal(v, nets[0].state_dict()[k]) for k, v in loaded.state_dict().items())


def test_state_round_trips_through_a_weights_only_load(tmp_path):
    rng = np.random.default_rng(0)
    state = {
        "weights": {"w": rng.normal(size=(3, 2)).astype(np.float32)},
        "rows": [{"loss": np.float64(0.25), "n": np.int64(4), "name": "a"}],
        "times": {(1, 2): 0.5},
        "t": torch.arange(3),
    }
    ckpt.save_state(tmp_path / "s.pt", state)
    back = ckpt.load_state(tmp_path / "s.pt")
    assert torch.equal(back["weights"]["w"], torch.from_numpy(state["weights"]["w"]))
    assert back["rows"] == [{"loss": 0.25, "n": 4, "name": "a"}]
    assert type(back["rows"][0]["loss"]) is float and back["times"] == {(1, 2): 0.5}
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]


def test_global_rngs_are_restored_by_a_resume(tmp_path):
    identity = JobIdentity("j", "d", "c")
    checkpoint = Checkpoint(tmp_path / CHECKPOINT, identity)
    torch.manual_seed(1), np.random.seed(1)
    checkpoint.save({"epoch": 1})
    expected = (torch.rand(2), np.random.rand(2))
    torch.manual_seed(9), np.random.seed(9)
    assert checkpoint.load()["epoch"] == 1
    assert torch.equal(torch.rand(2), expected[0])
    assert np.array_equal(np.random.rand(2), expected[1])


@pytest.mark.parametrize(
    ("changed", "reason"),
    [
        (JobIdentity("j2", "d", "c"), "wildcards, params or seed changed"),
        (JobIdentity("j", "d2", "c"), "input data changed"),
        (JobIdentity("j", "d", "c2"), "code changed (c → c2)"),
    ],
)
def test_a_checkpoint_of_another_identity_is_not_resumed(tmp_path, capsys, changed, reason):
    Checkpoint(tmp_path / CHECKPOINT, JobIdentity("j", "d", "c")).save({"epoch": 1})
    assert Checkpoint(tmp_path / CHECKPOINT, changed).load() is None
    assert reason in capsys.readouterr().out


def test_data_digest_follows_the_content_of_every_file(tmp_path):
    data = tmp_path / "processed"
    (data / "sub").mkdir(parents=True)
    (data / "meta.json").write_text("{}")
    (data / "sub" / "a.npy").write_bytes(b"\x00" * 10)
    before = job_identity("seg", data, {"a": "1"}, {"lr": 0.1}, 0)
    assert job_identity("seg", data, {"a": "1"}, {"lr": 0.1}, 0) == before
    (data / "sub" / "a.npy").write_bytes(b"\x00" * 9 + b"\x01")
    after = job_identity("seg", data, {"a": "1"}, {"lr": 0.1}, 0)
    assert after.data != before.data and after.job == before.job
    assert job_identity("seg", data, {"a": "1"}, {"lr": 0.2}, 0).job != after.job


def test_code_version_covers_the_study_and_the_shared_core_only(tmp_path, monkeypatch):
    package = tmp_path / "dpmed"
    shutil.copytree(Path(dpmed.__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    monkeypatch.setattr(dpmed, "__file__", str(package / "__init__.py"))

    def versions() -> dict[str, str]:
        ckpt.code_version.cache_clear()
        return {study: ckpt.code_version(study) for study in ("seg", "fets", "xcal")}

    try:
        base = versions()
        assert all(v.startswith(dpmed.__version__ + "+") for v in base.values())
        with open(package / "fets" / "run.py", "a") as handle:
            handle.write("\n# edited\n")
        fets_edit = versions()
        assert fets_edit["fets"] != base["fets"]
        assert fets_edit["seg"] == base["seg"] and fets_edit["xcal"] == base["xcal"]
        with open(package / "privacy" / "accounting.py", "a") as handle:
            handle.write("\n# edited\n")
        core_edit = versions()
        assert all(core_edit[s] != fets_edit[s] for s in base)
    finally:
        monkeypatch.undo()
        ckpt.code_version.cache_clear()


def test_weights_of_a_module_survive_the_round_trip(tmp_path):
    net = nn.Linear(3, 2)
    ckpt.save_state(tmp_path / "m.pt", {"model": net.state_dict()})
    other = nn.Linear(3, 2)
    other.load_state_dict(ckpt.load_state(tmp_path / "m.pt")["model"])
    assert torch.equal(other.weight, net.weight)
