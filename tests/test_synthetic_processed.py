"""`synthetic_processed`, the data the FL launchers train on outside the workflow: the same
processed folder the workflow's data stage makes from the same config, and a clear stop when
the config's data are real."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from dpmed.data.stage import preprocess, synthesize, synthetic_processed


def smoke_data(dataset: str) -> dict:
    return yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())["data"][dataset]


def test_it_is_what_the_data_stage_makes(tmp_path):
    cfg = smoke_data("bloodmnist")
    got = synthetic_processed("bloodmnist", cfg, tmp_path / "launcher")
    synthesize("bloodmnist", cfg, tmp_path / "stage" / "raw")
    preprocess("bloodmnist", cfg, tmp_path / "stage" / "raw", tmp_path / "stage" / "processed")
    want = tmp_path / "stage" / "processed"
    names = sorted(p.relative_to(want) for p in want.rglob("*") if p.is_file())
    assert names and names == sorted(p.relative_to(got) for p in got.rglob("*") if p.is_file())
    assert all((got / n).read_bytes() == (want / n).read_bytes() for n in names)


def test_real_data_in_the_config_stop_with_the_key(tmp_path):
    with pytest.raises(SystemExit, match=r"data\.fets\.raw is not synthetic"):
        synthetic_processed("fets", {**smoke_data("fets"), "raw": "/data/fets"}, tmp_path)
