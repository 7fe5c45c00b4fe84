"""One smoke cell of each study (seg with its attack, fets, xcal) through a real SLURM cluster,
run as docs/cluster.md tells users: `make slurm-profile` (into a temporary home), then
`snakemake --profile slurm` from the project root, job states read with sacct (the profile's
default; the cluster keeps accounting in slurmdbd). GPU jobs must reach the gpu partition with
one GPU and the memory and time the cost model sizes from the smoke settings (a constant
paper-scale request could not even be submitted); the seg cell's training and attack travel as
one group job. `bench/job_cost.py --benchmarks` must turn every training and attack job into a
point of its rule with the measures of the job's own Snakemake benchmark file, the seg cell's
group members (training, then attack) each its own.

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
from dpmed.seg.outputs import ATTACK_FILE

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "config" / "smoke.yaml"
TRAINING_RULES = {"seg_train", "seg_attack", "fets_train", "xcal_train"}
# Every rule a smoke cell's DAG submits (the data stage and the training/attack rules).
RULE_NAMES = TRAINING_RULES | {"synthesize", "preprocess", "preprocess_fets"}

pytestmark = pytest.mark.skipif(
    not os.environ.get("DPMED_SLURM_CLUSTER"),
    reason="needs the one-node cluster of tests/slurm/local_cluster.sh (make test-slurm)",
)


def install_site_profile(home: Path) -> dict[str, str]:
    """`make slurm-profile` with this cluster's account and partitions, into `home`; the
    environment that makes `--profile slurm` find it."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_CONFIG_HOME"}
    env["HOME"] = str(home)
    values = ["ACCOUNT=dpmed", "CPU_PARTITION=cpu", "GPU_PARTITION=gpu"]
    subprocess.run(["make", "-s", "slurm-profile", *values], cwd=REPO, env=env, check=True)
    return env


def smoke_cells() -> tuple[list[str], dict[str, job_cost.Request], dict[str, str]]:
    """The targets (an attack of one seg cell, its training coming with it; one fets and one
    xcal run), the request each of their training and attack rules should make (the smoke
    config with `device: auto`, so they ask for a GPU) and the seg cell's wildcards."""
    config = load_configs([SMOKE])
    config["device"] = "auto"
    grid = check_config(config, REPO / "config" / "schema.yaml")
    seg, xcal = grid.jobs("seg")[0], grid.jobs("xcal")[0]
    # a DP row of Table II (6 collaborators per round), not a sweep cell with all 33
    fets = next(
        job
        for job in grid.jobs("fets")
        if job.wc["dpmode"] == "sound" and "-rho" not in job.wc["aggregator"]
    )
    expected = {}
    for rule, job in (("seg_train", seg), ("seg_attack", seg), ("fets_train", fets),
                      ("xcal_train", xcal)):  # fmt: skip
        hp = grid.params(job.study, job.wc)
        expected[rule] = job_cost.request(rule, config, job.wc, hp, gpu=True)
    targets = [f"{seg.path}/{ATTACK_FILE}", f"{fets.path}/privacy.json",
               f"{xcal.path}/privacy.json"]  # fmt: skip
    return targets, expected, seg.wc


def slurm_jobs() -> list[dict[str, str]]:
    """Every job slurmctld still knows (MinJobAge keeps finished ones), as key=value fields."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o"], check=True, capture_output=True, text=True
    ).stdout
    return [dict(re.findall(r"(\S+?)=(\S*)", line)) for line in out.splitlines() if line]


def submitted_rules(job: dict[str, str]) -> set[str]:
    """The rules a SLURM job ran, from the comment the executor gives it: `rule_<rule>` or
    `rule_<rule>_wildcards_...`; a group job `rule_<group id>_<its rules joined by _>`."""
    comment = job.get("Comment", "")
    assert comment.startswith("rule_"), comment
    return {rule for rule in RULE_NAMES if re.search(rf"(^rule_|_){rule}(_|$)", comment)}


def check_refit(work: Path, env: dict[str, str]) -> None:
    """`bench/job_cost.py --benchmarks` on the run's working folder (its jobs ran on the CPU:
    the cluster's GPU gres has no CUDA behind it) gives each training and attack rule one
    point, with the seconds and peak of the job's benchmark file, and prints them (also into
    refit.txt beside the work folder)."""
    from dpmed.config.grid import wildcards_from_path
    from dpmed.sizing import sized_rules
    from dpmed.studies import STUDIES

    out = work.parent / "job_cost.json"
    printed = subprocess.run(
        [sys.executable, str(REPO / "bench" / "job_cost.py"), "--benchmarks", str(work),
         "--configfile", str(SMOKE), "--out", str(out)],
        cwd=REPO, env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    print(printed)
    (work.parent / "refit.txt").write_text(printed)

    # The cluster's jobs join the committed points of source "run" (the demo's), each
    # replacing the point of the same job (rule, wildcards, params, data), with its own
    # measurement.
    def key(point: dict) -> str:
        return json.dumps([point[k] for k in ("rule", "wildcards", "params", "data")],
                          sort_keys=True)  # fmt: skip

    def runs(text: str) -> dict[str, dict]:
        points = (json.loads(line) for line in text.splitlines() if line)
        return {key(p): p for p in points if p["source"] == "run"}

    committed = runs((REPO / "bench" / "job_cost_points.jsonl").read_text())
    saved = runs(out.with_name("job_cost_points.jsonl").read_text())
    here = {}
    for tsv in sorted((work / "benchmarks").glob("*/**/*.tsv")):
        rule = tsv.relative_to(work / "benchmarks").parts[0]
        if rule not in TRAINING_RULES:
            continue
        study = sized_rules()[rule]
        run = f"results/{study}/{tsv.relative_to(work / 'benchmarks' / rule).with_suffix('')}"
        assert STUDIES[study].path.format(**wildcards_from_path(study, run)) == run
        header, values = tsv.read_text().splitlines()[:2]
        row = dict(zip(header.split("\t"), values.split("\t"), strict=True))
        same_job = [
            p
            for p in saved.values()
            if p["rule"] == rule and STUDIES[study].path.format(**p["wildcards"]) == run
        ]  # of another config (params) too: the one measured here is among them
        (point,) = [p for p in same_job if p["measured"]["time"] == float(row["s"])]
        assert point["measured"].get("mem", float(row["max_rss"])) == float(row["max_rss"])
        here[key(point)] = rule
    assert set(here.values()) == TRAINING_RULES
    assert saved.keys() == committed.keys() | here.keys()
    counts = {}
    for point in saved.values():
        counts[point["rule"]] = counts.get(point["rule"], 0) + 1
    assert json.loads(out.read_text())["points"]["run"] == counts


def test_one_cell_of_each_study_runs_on_slurm(tmp_path):
    env = install_site_profile(tmp_path / "home")
    work = tmp_path / "work"
    targets, expected, _ = smoke_cells()
    command = [
        sys.executable, "-m", "snakemake", *targets,
        "--directory", str(work), "--profile", "slurm", "--configfile", str(SMOKE),
        "--config", "device=auto",  # GPU rules ask for a GPU, as on a cluster
        "--slurm-logdir", str(tmp_path / "slurm-logs"),
        "--max-threads", str(os.cpu_count()),
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500
    )
    assert result.returncode == 0, result.stderr[-6000:]
    for target in targets:
        assert (work / target).is_file(), target
    privacy = json.loads((work / targets[1]).read_text())
    assert privacy["epsilon"] is not None  # the fets cell is a DP row

    jobs = slurm_jobs()
    ran = [submitted_rules(job) for job in jobs]
    assert TRAINING_RULES <= set().union(*ran), ran
    assert {"seg_train", "seg_attack"} in ran  # one seg cell, one group job
    for job, rules in zip(jobs, ran, strict=True):
        assert job["JobState"] == "COMPLETED", job
        gpu = bool(rules & TRAINING_RULES)
        assert rules <= TRAINING_RULES or not gpu, rules  # groups hold GPU rules only
        assert job["Partition"] == ("gpu" if gpu else "cpu"), (rules, job["Partition"])
        assert ("gres:gpu:1" in job.get("TresPerJob", "")) == gpu, (rules, job)
        if gpu:  # sized by the cost model; a group: largest memory, summed runtime
            mem_mb = max(expected[rule].mem_mb for rule in rules)
            hours, minutes = divmod(sum(expected[rule].runtime for rule in rules), 60)
            assert job["MinMemoryNode"] == f"{mem_mb}M", (rules, job["MinMemoryNode"])
            assert job["TimeLimit"] == f"{hours:02d}:{minutes:02d}:00", (rules, job)
    check_refit(work, env)
