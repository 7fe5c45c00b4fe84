"""One smoke cell of each study (seg with its attack, fets, xcal) through a real SLURM cluster,
run as the README tells users: `snakemake --profile <site profile>` with the placeholders of
profiles/slurm filled in, job states read with squeue (the cluster has no accounting database).
GPU rules must reach the gpu partition with one GPU and the memory and time the cost model sizes
from the smoke settings (a constant paper-scale request could not even be submitted).

Runs only inside tests/slurm/local_cluster.sh (`make test-slurm`), which starts a one-node
cluster and sets DPMED_SLURM_CLUSTER and SLURM_CONF.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpmed import job_cost
from dpmed.config.checks import check_config, load_configs
from dpmed.seg.spec import ATTACK_FILE

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "config" / "smoke.yaml"
TRAINING_RULES = {"seg_train", "seg_attack", "fets_train", "xcal_train"}

pytestmark = pytest.mark.skipif(
    not os.environ.get("DPMED_SLURM_CLUSTER"),
    reason="needs the one-node cluster of tests/slurm/local_cluster.sh (make test-slurm)",
)


def site_profile(folder: Path) -> Path:
    """profiles/slurm with its placeholders filled in, as the README asks a user to do."""
    text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    for placeholder, value in (
        ("<account>", "dpmed"),
        ("<cpu-partition>", "cpu"),
        ("<gpu-partition>", "gpu"),
    ):
        assert placeholder in text, placeholder
        text = text.replace(placeholder, value)
    profile = folder / "slurm"
    profile.mkdir(parents=True)
    (profile / "config.yaml").write_text(text)
    return profile


def smoke_cells() -> tuple[list[str], dict[str, job_cost.Request]]:
    """The targets (an attack of one seg cell, its training coming with it; one fets and one
    xcal run) and the request each of their training and attack rules should make (the smoke
    config with `device: auto`, so they ask for a GPU)."""
    config = load_configs([SMOKE])
    config["device"] = "auto"
    grid = check_config(config, REPO / "config" / "schema.yaml")
    seg, fets, xcal = grid.jobs("seg")[0], grid.jobs("fets")[-1], grid.jobs("xcal")[0]
    expected = {}
    for rule, job in (("seg_train", seg), ("seg_attack", seg), ("fets_train", fets),
                      ("xcal_train", xcal)):  # fmt: skip
        hp = grid.params(job.study, job.wc)
        expected[rule] = job_cost.request(rule, config, job.wc, hp, gpu=True)
    targets = [f"{seg.path}/{ATTACK_FILE}", f"{fets.path}/privacy.json",
               f"{xcal.path}/privacy.json"]  # fmt: skip
    return targets, expected


def slurm_jobs() -> list[dict[str, str]]:
    """Every job slurmctld still knows (MinJobAge keeps finished ones), as key=value fields."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o"], check=True, capture_output=True, text=True
    ).stdout
    return [dict(re.findall(r"(\S+?)=(\S*)", line)) for line in out.splitlines() if line]


def test_one_cell_of_each_study_runs_on_slurm(tmp_path):
    profile = site_profile(tmp_path / "profiles")
    work = tmp_path / "work"
    targets, expected = smoke_cells()
    command = [
        sys.executable, "-m", "snakemake", *targets,
        "--snakefile", str(REPO / "Snakefile"), "--directory", str(work),
        "--profile", str(profile), "--configfile", str(SMOKE),
        "--config", "device=auto",  # GPU rules ask for a GPU, as on a cluster
        "--slurm-status-command", "squeue",  # no accounting database
        "--max-threads", str(os.cpu_count()),
    ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stderr[-6000:]
    for target in targets:
        assert (work / target).is_file(), target
    privacy = json.loads((work / targets[1]).read_text())
    assert privacy["epsilon"] is not None  # the fets cell is a DP row

    jobs = slurm_jobs()
    rules = {}
    for job in jobs:
        match = re.fullmatch(r"rule_(\w+?)(_wildcards_.*)?", job.get("Comment", ""))
        assert match, job.get("Comment")
        rules.setdefault(match.group(1), []).append(job)
        assert job["JobState"] == "COMPLETED", job
    assert TRAINING_RULES <= set(rules), sorted(rules)
    for rule, submitted in rules.items():
        for job in submitted:
            gpu = rule in TRAINING_RULES
            assert job["Partition"] == ("gpu" if gpu else "cpu"), (rule, job["Partition"])
            assert ("gres:gpu:1" in job.get("TresPerJob", "")) == gpu, (rule, job)
            if gpu:  # the request the cost model sized from the smoke settings
                want = expected[rule]
                hours, minutes = divmod(want.runtime, 60)
                assert job["MinMemoryNode"] == f"{want.mem_mb}M", (rule, job["MinMemoryNode"])
                assert job["TimeLimit"] == f"{hours:02d}:{minutes:02d}:00", (rule, job)
