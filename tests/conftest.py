"""Shared fixtures: repository paths and one run of the whole smoke DAG reused by every
workflow test (the suite pays for the smoke grid once)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE_CONFIG = REPO / "config" / "smoke.yaml"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
DATA_STAGE_TARGETS = ["datasets_table", "data_overview", "fets_figure1"]


def run_snakemake(*args: str, cwd: Path = REPO, check: bool = True) -> subprocess.CompletedProcess:
    """Run Snakemake on the repository's Snakefile; output captured as text."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), *args]
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def run_data_stage(workdir: Path) -> None:
    """Run the data stage of the smoke config in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    run_snakemake(
        "--directory", str(workdir), "--configfile", str(SMOKE_CONFIG), "--cores", "2",
        *DATA_STAGE_TARGETS,
    )  # fmt: skip


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory where the whole smoke DAG (`rule all` of config/smoke.yaml: data
    stage, every study run, table and figure) has run once."""
    workdir = tmp_path_factory.mktemp("smoke")
    start = time.perf_counter()
    run_snakemake("--directory", str(workdir), "--configfile", str(SMOKE_CONFIG), "--cores", "2")
    print(f"smoke DAG: {time.perf_counter() - start:.0f} s")
    return workdir
