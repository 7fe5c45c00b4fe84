"""Probe class "planted files": what a killed job or a hand edit leaves behind. A killed
preprocessing's temporary folder is removed by the next run (only that output's own), a write
killed halfway keeps the previous preflight file, and a raw file overwritten in place reruns
preprocessing (`snakemake -n` plans it)."""

from __future__ import annotations

import json
import pathlib
from pathlib import Path

import numpy as np
import pytest
from conftest import SMOKE_CONFIG, run_snakemake

from dpmed.data import stage
from dpmed.data.synthetic import medmnist as synth_medmnist

DATASET = "pneumoniamnist"
CFG = {"size": 28, "synthetic": {"counts": [12, 6, 6]}}


def plant(folder: Path, size: int = 1 << 16) -> Path:
    """A temporary folder as a killed writer leaves it, holding one half-written file."""
    folder.mkdir(parents=True)
    (folder / "train.npz").write_bytes(b"\0" * size)
    return folder


# (case id, name planted next to the output, a folder (else a file), removed by the next run)
STALE = [
    ("own-stale-tmp", f".{DATASET}.k3x9_q2a.tmp", True, True),
    ("own-stale-tmp-second", f".{DATASET}.00000000.tmp", True, True),
    ("own-stale-tmp-file", f".{DATASET}.abcdefgh.tmp", False, True),
    ("other-dataset-tmp", ".covidct.k3x9_q2a.tmp", True, False),
    ("longer-name-tmp", f".{DATASET}.x.k3x9_q2a.tmp", True, False),
    ("not-random-part", f".{DATASET}.keep.tmp", True, False),
    ("other-suffix", f".{DATASET}.k3x9_q2a.bak", True, False),
]  # fmt: skip


@pytest.mark.parametrize(("name", "folder", "removed"), [c[1:] for c in STALE],
                         ids=[c[0] for c in STALE])  # fmt: skip
def test_preprocess_removes_only_its_own_stale_temporaries(
    tmp_path: Path, name: str, folder: bool, removed: bool
) -> None:
    raw, processed = tmp_path / "raw" / DATASET, tmp_path / "processed"
    synth_medmnist.generate(raw, DATASET, CFG, 0)
    planted = processed / name
    if folder:
        plant(planted)
    else:
        planted.parent.mkdir(parents=True)
        planted.write_bytes(b"half")
    stage.preprocess(DATASET, CFG, raw, processed / DATASET)
    assert (processed / DATASET / "meta.json").is_file()
    assert planted.exists() is not removed
    assert sorted(p.name for p in processed.iterdir()) == sorted(
        [DATASET] + ([] if removed else [name])
    )


def test_synthesize_removes_its_stale_temporary(tmp_path: Path) -> None:
    raw = tmp_path / "raw" / DATASET
    planted = plant(tmp_path / "raw" / f".{DATASET}.k3x9_q2a.tmp")
    stage.synthesize(DATASET, CFG, raw)
    assert not planted.exists() and (raw / f"{DATASET}.npz").is_file()


def test_a_half_written_processed_folder_is_replaced_whole(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw" / DATASET, tmp_path / "processed" / DATASET
    synth_medmnist.generate(raw, DATASET, CFG, 0)
    out.mkdir(parents=True)
    (out / "train.npz").write_bytes(b"PK\x03\x04 half")
    (out / "stray.txt").write_text("left by hand")
    stage.preprocess(DATASET, CFG, raw, out)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "test.npz", "train.npz",
                                                     "val.npz"]  # fmt: skip
    assert len(np.load(out / "train.npz")["labels"]) == 12


def _die_halfway(self: pathlib.Path, data: str, *args, **kwargs) -> int:
    """Path.write_text that writes half of `data` and then fails (a kill, a full disk)."""
    with open(self, "w") as handle:
        handle.write(data[: len(data) // 2])
    raise OSError("killed while writing")


def _write_cell(path: Path) -> None:
    from dpmed.preflight.run import write_cell

    class Job:
        wc = {"dataset": DATASET}
        params = {"eps": 1.0}

    class Cell:
        study, name, job = "xcal", "cell", Job()

    write_cell(path, {"data": {}}, Cell(), {"status": "ok", "peak_rss_mb": 1.0})


def _write_result(path: Path) -> None:
    from dpmed.preflight import study as probe

    spec = path.parent / "spec.json"
    if not spec.exists():
        spec.write_text(json.dumps({"probe": "none"}))
    original = probe.run_probe
    probe.run_probe = lambda spec: {"status": "ok", "wall_seconds": 1.0}
    try:
        probe.main([str(spec), str(path)])
    finally:
        probe.run_probe = original


@pytest.mark.parametrize("writer", [_write_cell, _write_result], ids=["cell", "probe-result"])
def test_preflight_write_killed_halfway_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer
) -> None:
    path = tmp_path / "work" / "result.json"
    path.parent.mkdir()
    writer(path)
    before = path.read_bytes()
    json.loads(before)
    monkeypatch.setattr(pathlib.Path, "write_text", _die_halfway)
    with pytest.raises(OSError, match="killed"):
        writer(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        ["result.json"] + (["spec.json"] if writer is _write_result else [])
    )


def test_a_raw_file_overwritten_in_place_reruns_preprocessing(tmp_path: Path) -> None:
    """Two Snakemake runs: build the processed data, overwrite the raw npz in place (the
    folder's mtime does not change), then a dry run must plan preprocessing and what follows."""
    work = tmp_path / "work"
    target = f"data/processed/{DATASET}/meta.json"
    args = ("--directory", str(work), "--configfile", str(SMOKE_CONFIG), "--cores", "2")
    run_snakemake(*args, target)
    raw = work / "data" / "raw" / DATASET
    npz = raw / f"{DATASET}.npz"
    folder_mtime = raw.stat().st_mtime_ns
    arrays = dict(np.load(npz))
    arrays["test_labels"] = 1 - arrays["test_labels"]
    with open(npz, "r+b") as handle:  # in place: same inode, same folder entry
        handle.truncate(0)
        np.savez(handle, **arrays)
    assert raw.stat().st_mtime_ns == folder_mtime
    result = run_snakemake("-n", *args, target)
    out = result.stdout + result.stderr
    assert "rule preprocess:" in out, out
    assert "rule synthesize:" not in out
