"""`snakemake --profile slurm` as a cluster user types it: `make slurm-profile` installs the site
profile where Snakemake looks the name up, and the workflow profile (profiles/default, loaded by
Snakemake itself) keeps dpmed's GPU jobs right whatever site profile named `slurm` the user had.

The plans are Snakemake's own dry runs, read from what it prints per job, of the demo grid as a
GPU cluster runs it (`device=auto`): every GPU rule and model in 15–20 s, where the paper grid
took about a minute a plan. test_pipeline checks every paper job's request."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TRAINING_RULES

from dpmed import job_cost
from dpmed.config.checks import check_config, load_configs
from dpmed.config.grid import wildcards_from_path
from dpmed.slurm_profile import install, user_profile_dir

SMOKE = REPO / "config" / "smoke.yaml"
ON_GPUS = {"device": "auto"}  # the demo grid as a GPU cluster would run it
GPU_RULES = {*TRAINING_RULES, "privacy_audit"}


def user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XDG_CONFIG_HOME"}
    return {**env, "HOME": str(home), "PYTHONHASHSEED": "0"}


def make_slurm_profile(home: Path, **values: str) -> subprocess.CompletedProcess:
    args = [f"{key}={value}" for key, value in values.items()]
    return subprocess.run(["make", "-s", "slurm-profile", *args], cwd=REPO, env=user_env(home),
                          capture_output=True, text=True)  # fmt: skip


def planned_jobs(home: Path, workdir: Path) -> list[dict]:
    """Every job of `snakemake --profile slurm -n` on the demo config with `device=auto`, run
    from the project root: its rule, wildcards and resources as Snakemake prints them."""
    cmd = [sys.executable, "-m", "snakemake", "--profile", "slurm", "-n",
           "--configfile", str(SMOKE), "--config", "device=auto",
           "--directory", str(workdir)]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, env=user_env(home), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "workflow specific profile profiles/default" in result.stderr
    assert "Shell command" not in result.stdout + result.stderr  # script rules have none
    jobs = []
    for block in re.split(r"\n\s*rule (?=\w+:)", result.stdout + result.stderr)[1:]:
        fields = dict(re.findall(r"^\s*(\w+): (.*)$", block, flags=re.M))
        jobs.append({
            "rule": block.split(":", 1)[0],
            "wildcards": dict(re.findall(r"(\w+)=([^,]+)", fields.get("wildcards", ""))),
            "resources": dict(re.findall(r"(\w+)=([^,]+)", fields["resources"])),
        })  # fmt: skip
    return jobs


def expected_request(rule: str, wildcards: dict[str, str]) -> job_cost.Request:
    """The request of a job of `rule`; a privacy audit asks for what its cell's training asks."""
    config = load_configs([SMOKE]) | ON_GPUS
    grid = check_config(config, REPO / "config" / "schema.yaml")
    if rule == "privacy_audit":
        study = wildcards["study"]
        rule = f"{study}_train"
        wildcards = wildcards_from_path(study, f"results/{study}/{wildcards['cell']}")
    hp = grid.params(rule.partition("_")[0], wildcards)
    return job_cost.request(rule, config, wildcards, hp, gpu=True)


def check_gpu_jobs(jobs: list[dict], partition: str | None) -> None:
    """Every training/attack job asks for one GPU and the memory and time dpmed.job_cost sizes
    for its cell (checked on one job per rule and model, the costly part); others for none."""
    seen = set()
    for job in jobs:
        rule, res = job["rule"], job["resources"]
        if rule not in GPU_RULES:
            assert res.get("gpu", "0") == "0", (rule, res)
            continue
        assert res["gpu"] == "1", (rule, res)
        if partition is not None:
            assert res["slurm_partition"] == partition, (rule, res)
        key = (rule, job["wildcards"].get("model"), job["wildcards"].get("dataset"))
        if key not in seen:
            seen.add(key)
            want = expected_request(rule, job["wildcards"])
            assert (int(res["mem_mb"]), int(res["runtime"])) == (want.mem_mb, want.runtime), key
    assert {rule for rule, *_ in seen} == GPU_RULES


def test_make_slurm_profile_installs_where_snakemake_looks_and_never_overwrites(tmp_path):
    result = make_slurm_profile(tmp_path, ACCOUNT="proj7", GPU_PARTITION="a100")
    assert result.returncode == 0, result.stderr
    installed = tmp_path / ".config" / "snakemake" / "slurm" / "config.yaml"
    assert installed.parent == user_profile_dir(env={"HOME": str(tmp_path)})
    text = installed.read_text()
    assert 'slurm_account: "proj7"' in text and 'slurm_partition: "a100"' in text
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == [
        f"slurm-profile: warning: {installed} still holds <cpu-partition>: fill it in"
    ]
    installed.write_text("# the user's own edits\n")
    again = make_slurm_profile(tmp_path, ACCOUNT="other")
    assert again.returncode != 0 and "already exists" in again.stderr
    assert installed.read_text() == "# the user's own edits\n"


def test_user_profile_dir_follows_xdg_config_home(tmp_path):
    env = {"HOME": "/home/u", "XDG_CONFIG_HOME": str(tmp_path)}
    assert user_profile_dir(env=env) == tmp_path / "snakemake" / "slurm"
    assert user_profile_dir(env={"HOME": "/home/u", "XDG_CONFIG_HOME": " "}) == Path(
        "/home/u/.config/snakemake/slurm"
    )


def test_install_reports_only_unfilled_placeholders_outside_comments(tmp_path):
    template = tmp_path / "template"
    template.mkdir()
    (template / "config.yaml").write_text('a: "<account>"  # e.g. "<qos>"\nb: "<gpu-partition>"\n')
    left = install(template, tmp_path / "dest", {"<account>": "p"})
    assert left == {tmp_path / "dest" / "config.yaml": ["<gpu-partition>"]}
    with pytest.raises(FileExistsError):
        install(template, tmp_path / "dest", {})


@pytest.mark.slow
def test_profile_slurm_from_the_project_root_plans_gpu_jobs_on_the_gpu_partition(tmp_path):
    assert make_slurm_profile(tmp_path, ACCOUNT="proj7", CPU_PARTITION="short",
                              GPU_PARTITION="a100").returncode == 0  # fmt: skip
    jobs = planned_jobs(tmp_path, tmp_path / "work")
    check_gpu_jobs(jobs, partition="a100")
    light = [job["resources"] for job in jobs if job["rule"] not in GPU_RULES]
    assert light and all(res["slurm_partition"] == "short" for res in light)


@pytest.mark.slow
def test_a_site_profile_named_slurm_of_the_users_own_keeps_gpu_jobs_sized(tmp_path):
    """A pre-existing site profile knows nothing of dpmed: GPU jobs still ask for one GPU and
    their sized memory and time (declared by the rules, not replaced by its default-resources)."""
    own = tmp_path / ".config" / "snakemake" / "slurm"
    own.mkdir(parents=True)
    (own / "config.yaml").write_text(
        "executor: slurm\njobs: 50\n"
        "default-resources:\n  slurm_partition: batch\n  mem_mb: 1000\n  runtime: 30\n"
    )
    check_gpu_jobs(planned_jobs(tmp_path, tmp_path / "work"), partition=None)


def test_the_demo_profile_logs_no_empty_shell_commands(tmp_path):
    """`make demo`'s profile: no "Shell command: None" line for each of dpmed's script jobs."""
    smoke = str(REPO / "config" / "smoke.yaml")
    cmd = [sys.executable, "-m", "snakemake", "-n", "--profile", "profiles/local",
           "--configfile", smoke, "--directory", str(tmp_path)]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rule seg_train:" in result.stdout + result.stderr
    assert "Shell command" not in result.stdout + result.stderr
