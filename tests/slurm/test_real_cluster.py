"""One smoke cell of each study (seg with its attack, fets, xcal) through a real SLURM cluster,
run as docs/cluster.md tells users: `make slurm-profile` (into a temporary home), then
`snakemake --profile slurm` from the project root, job states read with sacct (the profile's
default; the cluster keeps accounting in slurmdbd). GPU jobs must reach the gpu partition with
one GPU and the memory and time the cost model sizes from the smoke settings (a constant
paper-scale request could not even be submitted); the seg cell's training and attack travel as
one group job. The executor's efficiency report (the template's `slurm-efficiency-report`) must
hold every job, and `bench/job_cost.py refit` must turn every training job into points with
the measures sacct gives: the fets job alone, and the seg and xcal group jobs (their comments
name no wildcards) through their members as their kept SLURM logs name them (the template's
`slurm-keep-successful-logs`): the xcal group of one run a point of xcal_train, the seg cell's
group (training, then attack) a time equation over both rules and a memory point of its
largest member.

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

from dpmed import efficiency_report, job_cost
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


def sacct_measures(run_uuid: str) -> dict[str, tuple[float, float]]:
    """comment → (wall seconds, peak MB) of each job of the run, from sacct directly: its
    numbered steps' elapsed times summed and their peaks' largest (K units asked for)."""
    out = subprocess.run(
        ["sacct", f"--name={run_uuid}", "--parsable2", "--noheader", "--units=K",
         "--format=JobID,Comment,ElapsedRaw,MaxRSS"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    comments, measures = {}, {}
    for line in out.splitlines():
        job_id, comment, elapsed, rss = line.split("|")
        main, _, step = job_id.partition(".")
        if not step:
            comments[main] = comment
        elif step not in ("batch", "extern"):
            sec, peak = measures.get(main, (0.0, 0.0))
            measures[main] = (sec + int(elapsed), max(peak, float(rss.rstrip("K") or 0) / 1024))
    return {comments[main]: value for main, value in measures.items()}


def check_efficiency_report(
    folder: Path, slurm_logs: Path, work: Path, env: dict[str, str], seg_cell: dict[str, str]
) -> None:
    """The run's efficiency report holds each job's sacct measures, and the refit, given the
    kept SLURM logs, turns the fets training job and the xcal group job (one run) into points of
    their rules and the seg cell's group job (`seg_cell`'s training and attack, one after the
    other) into a group time point and a memory point of one of its rules, printed side by
    side (also into refit.txt beside the work folder)."""
    (report,) = folder.glob("efficiency_report_*.csv")
    run_uuid = report.stem.removeprefix("efficiency_report_")
    jobs = {job.comment: job for job in efficiency_report.read_jobs(report)}
    expected = sacct_measures(run_uuid)
    assert jobs.keys() == expected.keys()
    for comment, (seconds, peak_mb) in expected.items():
        assert jobs[comment].seconds == seconds, comment
        # sacct rounds a large peak to 3 digits (e.g. 1.50G) unless asked for K, as here
        assert jobs[comment].peak_mb == pytest.approx(peak_mb, rel=0.01), comment

    config = load_configs([SMOKE])
    grid = check_config(config, REPO / "config" / "schema.yaml")
    logs = efficiency_report.group_logs([slurm_logs])
    by_comment = {job.comment: job.job_id for job in jobs.values()}
    seg_job = by_comment["rule_seg_cell_seg_attack_seg_train"]
    xcal_job = by_comment["rule_xcal_run_xcal_train"]
    assert logs[seg_job] == efficiency_report.GroupLog(
        (("seg_train", seg_cell), ("seg_attack", seg_cell)), serial=True
    ), logs
    assert [rule for rule, _ in logs[xcal_job].members] == ["xcal_train"], logs
    points, groups, skipped = efficiency_report.cost_points(list(jobs.values()), config, grid, logs)
    assert not [why for why in skipped if "group" in why], skipped
    assert {"fets_train", "xcal_train"} <= points.keys() <= TRAINING_RULES, sorted(points)
    for rule in ("fets_train", "xcal_train"):
        (row,) = points[rule]
        comment = (f"rule_{rule}_wildcards_{row['cell'].removeprefix(rule + '/')}"
                   if rule == "fets_train" else "rule_xcal_run_xcal_train")  # fmt: skip
        measured = (row["measured"]["time"], row["measured"]["mem"])
        assert measured == pytest.approx(expected[comment], rel=0.01), comment
    (group,) = groups
    assert [m["rule"] for m in group["members"]] == ["seg_train", "seg_attack"]
    seg_seconds, seg_peak = expected["rule_seg_cell_seg_attack_seg_train"]
    assert (group["measured"]["time"], group["measured"]["mem"]) == pytest.approx(
        (seg_seconds, seg_peak), rel=0.01
    )
    (seg_rule,) = points.keys() - {"fets_train", "xcal_train"}
    assert points[seg_rule][0]["measured"]["mem"] == group["measured"]["mem"]
    out = work / "job_cost.json"
    printed = subprocess.run(
        [sys.executable, str(REPO / "bench" / "job_cost.py"), "refit",
         "--efficiency-report", str(report), "--slurm-logs", str(slurm_logs),
         "--configfile", str(SMOKE), "--out", str(out)],
        cwd=REPO, env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    print(printed)
    (work.parent / "refit.txt").write_text(printed)
    refitted = json.loads(out.read_text())
    for rule in points:
        assert refitted["slurm_fit"]["points"][rule] == 1
        assert rule in printed
    assert refitted["slurm_fit"]["groups"] == 1
    assert f"{seg_job} rule_seg_cell_seg_attack_seg_train" in printed


def test_one_cell_of_each_study_runs_on_slurm(tmp_path):
    env = install_site_profile(tmp_path / "home")
    work = tmp_path / "work"
    targets, expected, seg_cell = smoke_cells()
    command = [
        sys.executable, "-m", "snakemake", *targets,
        "--directory", str(work), "--profile", "slurm", "--configfile", str(SMOKE),
        "--config", "device=auto",  # GPU rules ask for a GPU, as on a cluster
        "--slurm-efficiency-report-path", str(tmp_path / "reports"),  # not the project root
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
    check_efficiency_report(tmp_path / "reports", tmp_path / "slurm-logs", work, env, seg_cell)
