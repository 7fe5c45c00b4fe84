"""A job starting in its run folder removes the temporaries that a killed run's atomic writes
left there (issue 53): `.checkpoint.pt.<random>.tmp` (a kill while checkpointing) and those of
its outputs (`.metrics.json.<random>.tmp`, a half `model.pt`, a temporary folder) stayed
forever. Only names of the writers' exact pattern go, and only in the run folder itself."""

from __future__ import annotations

from pathlib import Path

from conftest import XCAL_PARAMS, xcal_processed

from dpmed.checkpoint import CHECKPOINT, Checkpoint, JobIdentity
from dpmed.runtime import JobContext
from dpmed.xcal.run import run

STALE = [".checkpoint.pt.k3x9_q2a.tmp", ".metrics.json.00000000.tmp", ".model.pt.abcdefgh.tmp",
         ".a.b.ZZZZZZZZ.tmp"]  # fmt: skip
STALE_FOLDER = ".gradcam.npz.q1w2e3r4.tmp"
KEPT = ["checkpoint.pt.k3x9_q2a.tmp", ".checkpoint.pt.keep.tmp", ".metrics.json.k3x9_q2a.bak",
        "notes.tmp", ".metrics.json.k3x9_q2a9.tmp"]  # fmt: skip


def _plant(run_dir: Path) -> None:
    """The stale temporaries and the look-alikes that must stay, one of each below a
    sub-folder too."""
    (run_dir / "tensorboard").mkdir(parents=True)
    for name in STALE + KEPT:
        (run_dir / name).write_bytes(b"half written")
    (run_dir / STALE_FOLDER).mkdir()
    (run_dir / STALE_FOLDER / "images.npy").write_bytes(b"half")
    (run_dir / "tensorboard" / STALE[1]).write_bytes(b"another writer's")


def _left(run_dir: Path) -> set[str]:
    return {p.name for p in run_dir.iterdir()}


def test_loading_a_checkpoint_removes_the_run_folders_stale_temporaries(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _plant(run_dir)
    assert Checkpoint(run_dir / CHECKPOINT, JobIdentity("j", "d", "c")).load() is None
    assert _left(run_dir) == {*KEPT, "tensorboard"}
    assert (run_dir / "tensorboard" / STALE[1]).exists()
    said = capsys.readouterr().out
    assert all(f"{run_dir / name}: removed" in said for name in [*STALE, STALE_FOLDER])


def test_an_xcal_job_starting_again_removes_what_its_killed_run_left(tmp_path):
    processed = xcal_processed(tmp_path / "data", [40, 10, 12])
    run_dir = tmp_path / "run"
    _plant(run_dir)
    wc = {"dataset": "bloodmnist", "model": "resnet18", "method": "static", "shift": "iid",
          "clients": "2", "eps": "8", "seed": "0"}  # fmt: skip
    params = {**XCAL_PARAMS, "rounds": 1, "road_subsample": 4, "road_percentages": [0.5]}
    run(JobContext(processed, run_dir, wc, params, seed=0, device="cpu", threads=1))
    left = _left(run_dir)
    assert not left & {*STALE, STALE_FOLDER} and set(KEPT) <= left
    assert "metrics.json" in left and CHECKPOINT not in left
