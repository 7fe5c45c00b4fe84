"""dpmed used as a Snakemake module from another workflow's folder (as snakedeploy sets it up):
its paths resolve from its own Snakefile, and its jobs run its own src/ even when another
`dpmed` comes first on the Python path (an installed copy, another checkout's editable install).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SMOKE_CONFIG

from dpmed.config.checks import check_config, load_configs

MODULE_SNAKEFILE = """\
configfile: "{config}"

module dpmed:
    snakefile:
        "{snakefile}"
    config:
        config

use rule * from dpmed as dpmed_*
"""


@pytest.mark.slow
def test_one_smoke_cell_runs_through_the_workflow_used_as_a_module(tmp_path):
    deploying = tmp_path / "my-analysis"
    deploying.mkdir()
    (deploying / "Snakefile").write_text(
        MODULE_SNAKEFILE.format(config=SMOKE_CONFIG, snakefile=REPO / "Snakefile")
    )
    decoy = tmp_path / "site-packages" / "dpmed"  # a stale dpmed ahead on the path
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text('raise ImportError("a stale dpmed ran, not src/")\n')
    grid = check_config(load_configs([SMOKE_CONFIG]), REPO / "config" / "schema.yaml")
    run = grid.jobs("xcal")[0]
    target = f"{run.path}/privacy.json"

    env = {**os.environ, "PYTHONPATH": str(decoy.parent), "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", target]
    result = subprocess.run(cmd, cwd=deploying, env=env, capture_output=True, text=True)

    assert result.returncode == 0, result.stderr[-4000:]
    privacy = json.loads((deploying / target).read_text())
    assert privacy["epsilon"] is None  # the first xcal cell is the non-private run
    assert Path(deploying / "data" / "processed").is_dir()  # outputs land in the user's folder
    assert not (REPO / "results" / run.path).exists()
