"""`flwr run . local-simulation` in a copy of the app folder, as a Flower user runs it after
`make install`: the app's default run config (config/smoke.yaml's XCal-FL cell) with three
overrides (2 rounds of 1 local epoch, the simulated clients seeded from the job) generates its
synthetic data in <out>/data and writes the run folder the in-process run of the same job
writes: the same model, privacy.json, road.json and rounds; each simulated client held the
policy admitting exactly that job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from dpmed.install import workflow_file
from dpmed.models import load_model
from dpmed.xcal.run import run

pytest.importorskip("ray")
from flwr.common.config import fuse_dicts, parse_config_args  # noqa: E402

from dpmed.xcal.flower.policy import SitePolicy  # noqa: E402
from dpmed.xcal.flower.runconfig import app_defaults, job_from_run_config  # noqa: E402

pytestmark = pytest.mark.fl

BIN = Path(sys.executable).parent
OVERRIDES = "rounds=2 local_epochs=1 simulation-seeds='job'"
TOLERANCE = 1e-6


def test_flwr_run_local_simulation_writes_the_in_process_runs_outputs(tmp_path):
    app = tmp_path / "app"
    shutil.copytree(workflow_file("deploy/flower"), app, ignore=shutil.ignore_patterns(".flwr"))
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",  # as an activated virtualenv has it
        "FLWR_HOME": str(tmp_path / "home"),
    }
    cmd = [str(BIN / "flwr"), "run", ".", "local-simulation", "--run-config", OVERRIDES]
    result = subprocess.run(cmd, cwd=app, env=env, capture_output=True, text=True, timeout=500)
    log = result.stdout + result.stderr

    job = job_from_run_config(fuse_dicts(app_defaults(), parse_config_args([OVERRIDES])))
    job = replace(job, processed_dir=app / job.processed_dir, out_dir=app / job.out_dir)
    assert Path(job.out_dir).is_relative_to(app / "results" / "fl" / "flower"), job.out_dir
    assert (Path(job.out_dir) / "model.pt").is_file(), log[-4000:]
    assert (Path(job.processed_dir) / "train.npz").is_file()  # the synthetic data it made
    steps = [ln.split()[3] for ln in log.splitlines() if ln.startswith("[flower xcal ")]
    assert steps == ["1/2", "2/2"], log[-4000:]
    federation = json.loads((Path(job.out_dir) / "federation.json").read_text())
    assert federation["status"] == "completed" and sorted(federation["nodes"]) == ["0", "1", "2"]
    sites = sorted((app / "results/fl/flower/flower-simulation").glob("run-*/site-*"))
    assert [site.name for site in sites] == ["site-0", "site-1", "site-2"]
    for site in sites:
        assert SitePolicy.read(site / "policy.json") == SitePolicy.for_job(job)

    reference = tmp_path / "in-process"
    run(replace(job, out_dir=reference))
    simulated = load_model(Path(job.out_dir) / "model.pt").state_dict()
    expected = load_model(reference / "model.pt").state_dict()
    assert simulated.keys() == expected.keys()
    difference = max(
        (simulated[k].double() - expected[k].double()).abs().max().item() for k in expected
    )
    print(f"flwr run . local-simulation: max |simulated - in-process| = {difference:.3g}")
    assert difference <= TOLERANCE
    for name in ("privacy.json", "road.json"):
        assert json.loads((Path(job.out_dir) / name).read_text()) == json.loads(
            (reference / name).read_text()
        ), name
    pd.testing.assert_frame_equal(
        pd.read_csv(Path(job.out_dir) / "rounds.csv").drop(columns="seconds"),
        pd.read_csv(reference / "rounds.csv").drop(columns="seconds"),
    )
