"""Shared helpers: atomic writers, splits, logs and deterministic figures/tables."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpmed.data.splits import split_counts, split_subjects
from dpmed.errors import ConfigError
from dpmed.io import atomic_dir, atomic_path, write_json
from dpmed.logs import log_to
from dpmed.report.data import datasets_table
from dpmed.report.style import save_figure, to_markdown


def test_atomic_path_leaves_nothing_when_the_block_fails(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_only_on_success(tmp_path):
    target = tmp_path / "folder"
    target.mkdir()
    (target / "old").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "new").write_text("new")
            raise RuntimeError("killed")
    assert [p.name for p in tmp_path.iterdir()] == ["folder"]
    assert [p.name for p in target.iterdir()] == ["old"]
    with atomic_dir(target) as tmp:
        (tmp / "new").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new"]


def test_write_json_rejects_nan(tmp_path):
    with pytest.raises(ValueError):
        write_json(tmp_path / "x.json", {"eps": float("nan")})
    assert not (tmp_path / "x.json").exists()


def test_split_counts_examples():
    assert split_counts(10, [0.6, 0.2, 0.2]) == [6, 2, 2]
    assert split_counts(29, [0.6, 0.2, 0.2]) == [17, 6, 6]
    assert split_counts(2, [0.8, 0.2]) == [1, 1]  # a tiny institution keeps one of each
    with pytest.raises(ConfigError, match="data.x"):
        split_counts(2, [0.6, 0.2, 0.2], key="data.x")


@given(n=st.integers(3, 500), a=st.integers(1, 8), b=st.integers(0, 8), c=st.integers(1, 8))
def test_split_counts_partition_every_item(n, a, b, c):
    fractions = [a / (a + b + c), b / (a + b + c), c / (a + b + c)]
    try:
        counts = split_counts(n, fractions)
    except ConfigError:
        return  # too few items for this split
    assert sum(counts) == n
    assert all(k >= 1 for k, f in zip(counts, fractions, strict=True) if f > 0)


def test_split_subjects_is_a_seeded_partition():
    ids = [f"s{i:02d}" for i in range(20)]
    first = split_subjects(ids, [0.6, 0.2, 0.2], seed=1)
    assert first == split_subjects(list(reversed(ids)), [0.6, 0.2, 0.2], seed=1)
    assert first != split_subjects(ids, [0.6, 0.2, 0.2], seed=2)
    flat = [s for names in first.values() for s in names]
    assert sorted(flat) == ids and [len(v) for v in first.values()] == [12, 4, 4]


def test_log_to_keeps_prints_and_the_traceback(tmp_path):
    log = tmp_path / "logs" / "job.log"
    with pytest.raises(ValueError):
        with log_to(log):
            print("epoch 1")
            raise ValueError("bad shape in x.nii.gz")
    text = log.read_text()
    assert "epoch 1" in text and "bad shape in x.nii.gz" in text and "Traceback" in text


def test_a_job_process_exits_with_the_heap_frozen_and_its_log_written(tmp_path):
    """The exit handler `log_to` registers freezes the collector (so shutdown does not scan
    torch's objects) after the script's own handlers, and the log is complete."""
    log = tmp_path / "job.log"
    script = (
        "import atexit, gc\n"
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
        "from dpmed.logs import log_to\n"
        f"with log_to({str(log)!r}):\n"
        "    atexit.register(lambda: print('job handler, frozen:', gc.get_freeze_count() > 0))\n"
        "    print('epoch 1')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["job handler, frozen: False", "frozen at exit: True"]
    assert log.read_text() == "epoch 1\n"


def _figure() -> plt.Figure:
    fig, ax = plt.subplots()
    ax.plot(np.arange(5), np.arange(5) ** 2)
    ax.set_title("x")
    return fig


def test_figures_are_byte_identical(tmp_path):
    save_figure(_figure(), tmp_path / "a.png")
    save_figure(_figure(), tmp_path / "b.png")
    for suffix in (".png", ".pdf"):
        a = hashlib.sha256((tmp_path / f"a{suffix}").read_bytes()).hexdigest()
        b = hashlib.sha256((tmp_path / f"b{suffix}").read_bytes()).hexdigest()
        assert a == b


def test_datasets_table_concatenates_meta_counts(tmp_path):
    write_json(
        tmp_path / "a.json",
        {
            "counts": [
                {
                    "split": "train",
                    "unit": "images",
                    "count": 3,
                    "institution": "all",
                    "class_name": "all",
                }
            ]
        },
    )
    write_json(
        tmp_path / "b.json",
        {
            "counts": [
                {
                    "split": "val",
                    "unit": "subjects",
                    "count": 2,
                    "institution": "7",
                    "class_name": "all",
                }
            ]
        },
    )
    frame = datasets_table(
        [tmp_path / "a.json", tmp_path / "b.json"], tmp_path / "datasets.csv", ["a", "b"]
    )
    expected = pd.DataFrame(
        {
            "dataset": ["a", "b"],
            "split": ["train", "val"],
            "institution": ["all", "7"],
            "class_name": ["all", "all"],
            "unit": ["images", "subjects"],
            "count": [3, 2],
        }
    )
    pd.testing.assert_frame_equal(frame, expected)
    assert (tmp_path / "datasets.csv").read_text().splitlines()[0] == (
        "dataset,split,institution,class_name,unit,count"
    )
    assert "| a | train | all | all | images | 3 |" in (tmp_path / "datasets.md").read_text()


def test_markdown_formats_floats():
    text = to_markdown(pd.DataFrame({"x": [0.123456], "y": ["a"]}))
    assert text == "| x | y |\n| --- | --- |\n| 0.1235 | a |\n"


def test_atomic_outputs_get_normal_permissions(tmp_path):
    write_json(tmp_path / "a.json", {})
    with atomic_dir(tmp_path / "d"):
        pass
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~mask
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o777 & ~mask
