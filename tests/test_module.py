"""dpmed used as a Snakemake module from another workflow's folder (as snakedeploy sets it up):
its paths resolve from its own Snakefile, and its jobs run its own src/ even when another
`dpmed` comes first on the Python path (an installed copy, another checkout's editable install).
From a versioned source (a git tag, as `github(...)` and snakedeploy give) the workflow is read
out of git and runs the dpmed library installed at the same tag.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SMOKE_CONFIG

import dpmed
from dpmed.config.checks import check_config, load_configs
from dpmed.studies import STUDIES

GIT = ["git", "-c", "user.name=dpmed-test", "-c", "user.email=test@dpmed.invalid"]
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
    # the smoke grid's lightest non-private cell (its data stage and training take seconds)
    (run,) = [job for job in grid.jobs("xcal")
              if job.wc["dataset"] == "pneumoniamnist" and job.wc["method"] == "nondp"]  # fmt: skip
    target = f"{run.path}/privacy.json"

    env = {**os.environ, "PYTHONPATH": str(decoy.parent), "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", target]
    result = subprocess.run(cmd, cwd=deploying, env=env, capture_output=True, text=True)

    assert result.returncode == 0, result.stderr[-4000:]
    privacy = json.loads((deploying / target).read_text())
    assert privacy["epsilon"] is None
    assert Path(deploying / "data" / "processed").is_dir()  # outputs land in the user's folder
    assert not (REPO / "results" / run.path).exists()


def tagged_snapshot(clone: Path, tag: str) -> None:
    """A git repository at `clone` holding this checkout as it is now (tracked and untracked,
    not ignored, files), committed and tagged."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (REPO / name).is_file():  # a tracked file deleted in the work tree is left out
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "snapshot"], ["tag", tag]):
        subprocess.run([*GIT, *args], cwd=clone, check=True)


def planned_jobs(dry_run_output: str) -> dict[str, int]:
    """Rule → job count from the "Job stats" table of a dry run."""
    table = dry_run_output.split("Job stats:")[1].split("Reasons:")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\S+)\s+(\d+)$", table, re.MULTILINE)}


def module_snakefile(folder: Path, snakefile: str) -> Path:
    """`folder` made a deploying workflow that uses dpmed's Snakefile `snakefile` as a module."""
    folder.mkdir()
    (folder / "Snakefile").write_text(
        MODULE_SNAKEFILE.format(config=SMOKE_CONFIG, snakefile=snakefile)
    )
    return folder


@pytest.mark.slow
def test_the_workflow_deploys_as_a_module_from_a_git_tag_with_the_library_of_that_tag(tmp_path):
    clone, site = tmp_path / "dpmed-clone", tmp_path / "site-packages"
    tag, version = "v0.0.1", "0.0.1"  # a version no other dpmed on the path has
    tagged_snapshot(clone, tag)
    deploying = module_snakefile(tmp_path / "my-analysis", f"git+file://{clone}/Snakefile@{tag}")
    # Offline: pip clones the tag and builds with this environment's setuptools(-scm).
    pip_source = f"git+file://{clone}@{tag}"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    # Snakemake 9.27.1 cannot join a `script:` path to a git+file rule folder when it checks
    # whether the code changed (github(...) sources can): that one rerun trigger is left out.
    triggers = ["--rerun-triggers", "mtime", "params", "input", "software-env"]
    dry_run = [sys.executable, "-m", "snakemake", "-n", "--cores", "2", *triggers]

    missing = subprocess.run(dry_run, cwd=deploying, capture_output=True, text=True)
    subprocess.run([*pip, "--target", str(site), pip_source], check=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    planned = subprocess.run(dry_run, cwd=deploying, env=env, capture_output=True, text=True)
    # the workflow one commit later, with the tag's library
    (clone / "README.md").write_text((clone / "README.md").read_text() + "\nA later commit.\n")
    subprocess.run([*GIT, "commit", "-qam", "later"], cwd=clone, check=True)
    later = subprocess.run([*GIT, "rev-parse", "HEAD"], cwd=clone, capture_output=True,
                           text=True, check=True).stdout.strip()  # fmt: skip
    moved = module_snakefile(tmp_path / "later", f"git+file://{clone}/Snakefile@{later}")
    refused = subprocess.run(dry_run, cwd=moved, env=env, capture_output=True, text=True)

    # this checkout's dpmed (another commit) is not taken for the tag's: the message says
    # which library to install
    assert missing.returncode != 0
    message = missing.stdout + missing.stderr
    assert f"needs the dpmed library built from that commit (found {dpmed.__version__} in " in (
        message
    )
    assert f'pip install "{pip_source}"' in message
    assert planned.returncode == 0, planned.stderr[-4000:]
    grid = check_config(load_configs([SMOKE_CONFIG]), REPO / "config" / "schema.yaml")
    jobs = planned_jobs(planned.stdout + planned.stderr)
    assert {name: jobs.get(f"dpmed_{name}_train") for name in STUDIES} == {
        name: len(grid.jobs(name)) for name in STUDIES
    }
    assert jobs["dpmed_all"] == 1
    assert not (deploying / "results").exists()  # a dry run
    # the tag's library is refused by the workflow of the next commit, naming both
    assert refused.returncode != 0
    message = refused.stdout + refused.stderr
    assert f"commit {later[:12]}) needs the dpmed library built from that commit" in message
    assert f"(found {version} in {site / 'dpmed'})" in message
    assert f'pip install "git+file://{clone}@{later}"' in message
