"""`bench/job_cost.py refit`: the jobs of a SLURM efficiency report (the executor plugin's CSV,
tests/data/efficiency_report_slurm.csv, copied from a run of `make test-slurm` with the group
jobs' SLURM logs the executor kept, tests/data/slurm_logs/) or of sacct output become points
of the cost model, and the refit recovers known coefficients."""

from __future__ import annotations

import copy
import csv
import json

import pytest
from conftest import REPO, SMOKE_CONFIG

from dpmed import efficiency_report, job_cost
from dpmed.config.checks import check_config, load_configs

REPORT = REPO / "tests" / "data" / "efficiency_report_slurm.csv"
SLURM_LOGS = REPO / "tests" / "data" / "slurm_logs"  # the group jobs' logs of that run


def _bench_job_cost():
    """bench/job_cost.py as a module (bench scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_job_cost", REPO / "bench/job_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def smoke():
    config = load_configs([SMOKE_CONFIG])
    return config, check_config(config, REPO / "config" / "schema.yaml")


def test_sacct_figures():
    assert efficiency_report.elapsed_seconds("1-02:03:04") == 93784
    assert efficiency_report.elapsed_seconds("00:01:05") == 65
    assert efficiency_report.elapsed_seconds("02:03.500") == 123.5
    assert efficiency_report.rss_mb("320616K") == pytest.approx(313.1015625)
    assert efficiency_report.rss_mb("1.5G") == 1536
    assert efficiency_report.rss_mb("") == efficiency_report.rss_mb("0") == 0
    with pytest.raises(ValueError, match="memory figure"):
        efficiency_report.rss_mb("12 MB")


def test_sacct_output_gives_a_job_its_steps_summed_time_and_largest_peak(tmp_path):
    sacct = tmp_path / "sacct.txt"
    sacct.write_text(
        "JobID|JobName|Comment|Elapsed|MaxRSS|NCPUS\n"
        "41|run-1|rule_fets_train_wildcards_fedavg_none_inf_0|00:01:10||2\n"
        "41.batch|batch||00:01:10|9000K|2\n"
        "41.extern|extern||00:01:10|900K|2\n"
        "41.0|python3.11||00:01:00|1.5G|2\n"
        "41.1|python3.11||00:00:09|2048M|2\n"
        "42|run-1|rule_synthesize_wildcards_duke|00:00:04||1\n"
    )
    assert efficiency_report.read_jobs(sacct) == [
        efficiency_report.MeasuredJob(
            "41", "rule_fets_train_wildcards_fedavg_none_inf_0", 69.0, 2048.0
        )  # fmt: skip
    ]


def test_a_report_without_comments_is_refused(tmp_path):
    """The executor drops the RuleName column when the cluster stored no comments."""
    bare = tmp_path / "efficiency_report_x.csv"
    bare.write_text(",JobID,JobName,Elapsed,MaxRSS,Elapsed_sec,MaxRSS_MB,MainJobID\n"
                    "2,1.0,python3,00:00:04,100K,4,0.09765625,1\n")  # fmt: skip
    with pytest.raises(ValueError, match="job_comment"):
        efficiency_report.read_jobs(bare)


def test_comment_values_follow_the_output_path():
    """The executor joins a job's wildcard values in its output path's order, '/' as '_'."""
    wc = {"seed": "0", "eps": "inf", "dpmode": "none", "aggregator": "fed/avg"}
    assert efficiency_report.wildcard_values("fets", wc) == "fed_avg_none_inf_0"
    assert efficiency_report.parse_comment("rule_xcal_train_wildcards_a_b") == ("xcal_train",
                                                                               "a_b")  # fmt: skip
    assert efficiency_report.parse_comment("rule_synthesize") == ("synthesize", "")


def crafted_report(path, header, rows):
    """A report in the executor's CSV shape (`header` from the real one), one step per job."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, restval="")
        writer.writeheader()
        for i, (comment, seconds, peak_mb) in enumerate(rows):
            writer.writerow({"": i, "JobID": f"{i + 1}.0", "JobName": "python3.11",
                             "RuleName": comment, "Elapsed_sec": seconds,
                             "MaxRSS_MB": peak_mb, "MainJobID": str(i + 1)})  # fmt: skip


def test_refit_recovers_the_coefficients_that_made_the_measures(tmp_path):
    """Every xcal job of the smoke grid measured exactly as chosen coefficients predict (the
    known host and device MB added to the memory): refitted alone, the rule gets those
    coefficients back (the least-squares time fit and the least upper envelope of the memory
    are both exact and unique here: the features have full column rank), a SLURM point of a
    re-measured cell replaces the old one and points of other sources stay."""
    config, grid = smoke()
    time_coef = {"const": 20.0, "road": 3e6, "round": 7.0, "work_efficientnet_b0": 4e4,
                 "work_resnet18": 9e4}  # fmt: skip
    mem_coef = {"const": 400.0, "act_efficientnet_b0": 300.0, "act_resnet18": 700.0}
    rows = []
    for job in grid.jobs("xcal"):
        mem, time = job_cost.features("xcal_train", config, job.wc, job.params)
        seconds = sum(time_coef[n] * v for n, v in time.items())
        peak = mem["host"] + mem["device"] + sum(mem_coef[n] * mem.get(n, 0) for n in mem_coef)
        rows.append((f"rule_xcal_train_wildcards_{'_'.join(job.wc.values())}", seconds, peak))
    with open(REPORT, newline="") as f:
        header = next(csv.reader(f))
    crafted_report(tmp_path / "report.csv", header, rows)

    jobs = efficiency_report.read_jobs(tmp_path / "report.csv")
    points, groups, skipped = efficiency_report.cost_points(jobs, config, grid)
    assert skipped == [] and groups == [] and list(points) == ["xcal_train"]
    assert len(points["xcal_train"]) == len(rows)
    first = points["xcal_train"][0]
    # a preflight point of the first cell, measured as exactly; a stale SLURM point of it
    other = {
        "source": "preflight",
        "cell": "p",
        "wildcards": first["wildcards"],
        "params": first["params"],
        "data": first["data"],
        "measured": first["measured"],
    }
    stale = dict(first, measured={"mem": 1e6, "time": 1e6})
    saved = {"rules": {"xcal_train": {"points": [stale, other], "mem": {}, "time": {}}}}
    found = {rule: {p["cell"]: p for p in found} for rule, found in points.items()}
    _bench_job_cost().refit_with(saved, "slurm", found)
    entry = saved["rules"]["xcal_train"]
    assert len(entry["points"]) == len(rows) + 1 and other in entry["points"]
    assert stale not in entry["points"]
    assert entry["time"] == pytest.approx(time_coef, rel=1e-6, abs=1e-9)
    assert entry["mem"] == pytest.approx(mem_coef, rel=1e-6, abs=1e-9)
    assert saved["slurm_fit"]["points"] == {"xcal_train": len(rows)}


def test_the_real_report_without_logs_gives_the_fets_job_and_leaves_out_the_groups(
    tmp_path, capsys
):
    """tests/data/efficiency_report_slurm.csv (`make test-slurm`): the fets training job ran
    alone (9 s, MaxRSS 797508K = 778.82 MB); without their SLURM logs the seg and xcal group
    jobs cannot be matched to cells and are left out, saying why, as are the data jobs. The
    refit adds the point, keeps the envelope over it and prints both models."""
    config, grid = smoke()
    jobs = efficiency_report.read_jobs(REPORT)
    assert len(jobs) == 9
    points, groups, skipped = efficiency_report.cost_points(jobs, config, grid)
    (point,) = points["fets_train"]
    assert point["wildcards"] == {"aggregator": "dp_simagg", "dpmode": "sound", "eps": "1",
                                  "seed": "0"}  # fmt: skip
    assert point["measured"] == {"time": 9.0, "mem": pytest.approx(797508 / 1024)}
    assert list(points) == ["fets_train"] and len(skipped) == 8 and groups == []
    unnamed = [why for why in skipped if "members are not named" in why]
    assert [why.split()[1] for why in unnamed] == ["7", "8"]  # xcal_run, seg_cell
    assert all("--slurm-keep-successful-logs" in why for why in unnamed)

    out = tmp_path / "job_cost.json"
    args = ["--efficiency-report", str(REPORT), "--configfile", str(SMOKE_CONFIG)]
    args += ["--out", str(out)]
    _bench_job_cost().refit_main(args)
    printed = capsys.readouterr().out
    refitted = json.loads(out.read_text())
    assert refitted["slurm_fit"]["points"]["fets_train"] == 1
    new = job_cost.predict("fets_train", point["mem"], point["time"], refitted)
    assert new.host_mb + new.compute_mb >= point["measured"]["mem"] * (1 - 1e-9)
    old = job_cost.predict("fets_train", point["mem"], point["time"])
    line = next(ln for ln in printed.splitlines() if ln.strip().startswith("dp_simagg/sound"))
    assert line.split()[1:] == [
        "779", f"{old.host_mb + old.compute_mb:.0f}", f"{new.host_mb + new.compute_mb:.0f}",
        "9.0", f"{old.seconds:.1f}", f"{new.seconds:.1f}",
    ]  # fmt: skip


def test_the_real_report_with_its_logs_counts_the_group_jobs(tmp_path, capsys):
    """The same run with its kept SLURM logs: the xcal group job (job 7: one run, 71 s, MaxRSS
    964080K) is a point of xcal_train; the seg cell's group job (job 8: its training, then its
    attack, 20 s, MaxRSS 794260K) is one group time point over both rules and a memory point of
    the member the saved model predicts the larger peak for. The refit prints the group job."""
    config, grid = smoke()
    jobs = efficiency_report.read_jobs(REPORT)
    logs = efficiency_report.group_logs([SLURM_LOGS])
    cell = {"dataset": "duke", "model": "unet", "clip": "none", "morph": "none", "eps": "inf",
            "seed": "0"}  # fmt: skip
    assert logs["8"] == efficiency_report.GroupLog((("seg_train", cell), ("seg_attack", cell)),
                                                   serial=True)  # fmt: skip
    points, groups, skipped = efficiency_report.cost_points(jobs, config, grid, logs)
    assert len(skipped) == 6 and not [why for why in skipped if "group" in why]
    (xcal,) = points["xcal_train"]
    assert xcal["measured"] == {"time": 71.0, "mem": pytest.approx(964080 / 1024)}
    (group,) = groups
    assert group["job"] == "8 rule_seg_cell_seg_attack_seg_train"
    assert [(m["rule"], m["wildcards"]) for m in group["members"]] == [
        ("seg_train", cell),
        ("seg_attack", cell),
    ]
    assert group["measured"] == {"time": 20.0, "mem": pytest.approx(794260 / 1024)}
    predicted = {
        m["rule"]: job_cost.predict(m["rule"], m["mem"], m["time"]) for m in group["members"]
    }
    largest = max(predicted, key=lambda r: predicted[r].host_mb + predicted[r].compute_mb)
    assert [p["measured"] for p in points[largest]] == [{"mem": group["measured"]["mem"]}]
    assert sorted(points) == sorted({"fets_train", "xcal_train", largest})

    out = tmp_path / "job_cost.json"
    args = ["--efficiency-report", str(REPORT), "--slurm-logs", str(SLURM_LOGS)]
    _bench_job_cost().refit_main(args + ["--configfile", str(SMOKE_CONFIG), "--out", str(out)])
    printed = capsys.readouterr().out
    refitted = json.loads(out.read_text())
    assert refitted["slurm_fit"]["groups"] == 1 and len(refitted["groups"]) == 1
    line = next(ln for ln in printed.splitlines() if ln.startswith("8 rule_seg_cell"))
    assert line.split()[2:4] == ["2", "776"]  # members, peak MB


def test_a_group_whose_members_overlapped_gives_its_peak_but_no_time(tmp_path):
    """Two xcal runs that overlapped in one group job (a CPU run packs them side by side): the
    job's seconds are no sum of theirs, so only its peak counts, as a memory point."""
    config, grid = smoke()
    first, second = grid.jobs("xcal")[:2]
    log = tmp_path / "group_xcal_run_xcal_train" / "3.log"
    log.parent.mkdir()
    starts = [(1, "xcal_train", first.wc), (2, "xcal_train", second.wc)]
    log.write_text(job_log(starts, [("start", 0), ("start", 1), ("end", 0), ("end", 1)]))
    job = efficiency_report.MeasuredJob("3", "rule_xcal_run_xcal_train", 50.0, 900.0)
    logs = efficiency_report.group_logs([tmp_path])
    points, groups, skipped = efficiency_report.cost_points([job], config, grid, logs)
    assert groups == [] and len(skipped) == 1 and "members overlapped" in skipped[0]
    assert [p["measured"] for p in points["xcal_train"]] == [{"mem": 900.0}]


def job_log(starts: list[tuple[int, str, dict]], order: list[tuple[str, int]]) -> str:
    """A group job's SLURM log as Snakemake writes it (its own formatter): the in-job Snakemake's
    summary of the group (members indented), then each member's start and end in `order`
    (("start" or "end", index into `starts`)); `starts` holds (jobid, rule, wildcards)."""
    from snakemake.logging import DefaultFormatter

    fmt = DefaultFormatter()

    def info(jobid, rule, wc, indent):
        return fmt.format_job_info({
            "rule_msg": None, "jobid": jobid, "reason": "Missing output files", "rule_name": rule,
            "local": False, "is_checkpoint": False, "input": ["in"], "output": ["out"],
            "log": ["log"], "benchmark": "b.tsv", "wildcards": wc, "priority": 0, "threads": 2,
            "resources": {"mem_mb": 5000, "gpu": 1}, "indent": indent,
        })  # fmt: skip

    lines = [
        "Building DAG of jobs...",
        "Using shell: /usr/bin/bash",
        "Provided cores: 2",
        fmt.format_group_info({"msg": "Group job 5c3e (jobs in lexicogr. order):"}),
    ]
    lines += [info(*start, indent=True) for start in starts]
    for what, i in order:
        jobid, rule = starts[i][:2]
        lines.append(
            info(*starts[i], indent=False)
            if what == "start"
            else fmt.format_job_finished({"msg": f"Finished jobid: {jobid} (Rule: {rule})"})
        )
    lines += [
        fmt.format_job_finished({"msg": f"Finished jobid: {j} (Rule: {r})"}) for j, r, _ in starts
    ]  # the group's end, as the submitting Snakemake reports it
    return "\n".join(lines) + "\n"


def serial(n: int) -> list[tuple[str, int]]:
    return [(what, i) for i in range(n) for what in ("start", "end")]


def test_a_group_log_names_its_members_and_whether_they_overlapped(tmp_path):
    wc = [{"dataset": "duke", "model": "unet", "eps": str(e)} for e in (1, 8)]
    starts = [(1, "seg_train", wc[0]), (2, "seg_attack", wc[0]), (3, "seg_train", wc[1])]
    log = tmp_path / "group_seg_cell_seg_attack_seg_train" / "42.log"
    log.parent.mkdir()
    log.write_text(job_log(starts, serial(3)))
    (tmp_path / "rule_synthesize" / "duke").mkdir(parents=True)
    (tmp_path / "rule_synthesize" / "duke" / "40.log").write_text("rule synthesize:\n")
    read = efficiency_report.group_logs([tmp_path])
    assert read == {"42": efficiency_report.GroupLog(
        (("seg_train", wc[0]), ("seg_attack", wc[0]), ("seg_train", wc[1])), True)}  # fmt: skip
    overlapped = [("start", 0), ("start", 2), ("end", 0), ("end", 2), ("start", 1), ("end", 1)]
    log.write_text(job_log(starts, overlapped))
    assert efficiency_report.read_group_log(log).serial is False
    assert efficiency_report.read_group_log(log).members[1] == ("seg_train", wc[1])


SEG_MODELS = ("unet", "unetpp", "lfunet", "infnet")
SEG_TIME = {
    "seg_train": dict(zip(SEG_MODELS, (40.0, 70.0, 90.0, 20.0), strict=True)),
    "seg_attack": dict(zip(SEG_MODELS, (200.0, 300.0, 500.0, 100.0), strict=True)),
}
SEG_TIME = {
    rule: {f"work_{m}": v for m, v in coef.items()} | {"const": const}
    for (rule, coef), const in zip(SEG_TIME.items(), (30.0, 5.0), strict=True)
}
XCAL_TIME = {"const": 20.0, "road": 3e6, "round": 7.0, "work_efficientnet_b0": 4e4,
             "work_resnet18": 9e4}  # fmt: skip
XCAL_MEM = {"const": 400.0, "act_efficientnet_b0": 300.0, "act_resnet18": 700.0}


def measures(rule, config, job):
    """(seconds, peak MB) of one job as the chosen coefficients make them (a seg job's peak:
    its known host and device MB)."""
    mem, time = job_cost.features(rule, config, job.wc, job.params)
    time_coef, mem_coef = (XCAL_TIME, XCAL_MEM) if rule == "xcal_train" else (SEG_TIME[rule], {})
    seconds = sum(time_coef[n] * v for n, v in time.items())
    return seconds, mem["host"] + mem["device"] + sum(
        c * mem.get(n, 0) for n, c in mem_coef.items()
    )


def test_group_jobs_with_their_logs_give_the_coefficients_that_made_them(tmp_path):
    """The smoke grid's xcal runs in group jobs of 1 to 4 runs and its seg cells (training and
    attack) in group jobs of 1 to 4 cells, each group's seconds the sum of its members' and its
    peak the largest of theirs, as chosen coefficients make them; one group's log is lost (left
    out). A one-run group is a plain point; any other group's peak is a memory point of the
    member the old model predicts the largest peak for. Refitted from these jobs alone: the
    xcal time coefficients come back exactly (3 one-run groups and 4 group equations over 5
    unknowns, full rank), and so does the xcal memory (the old model's largest members are the
    largest ones, so those points are tight); seg_train and seg_attack, fitted jointly, get
    back every coefficient the groups determine (each group holds as many training as attack
    jobs, so only the sum of the two constants; the lfunet cells have one ratio of training to
    attack work, so only their sum per cell); every group's predicted seconds equal its
    measured ones and its request's memory (its largest member's) covers its peak."""
    config, grid = smoke()
    bench = _bench_job_cost()
    old = copy.deepcopy(job_cost.coefficients())
    seg, xcal, cuts = grid.jobs("seg"), grid.jobs("xcal"), [0]
    while cuts[-1] < len(seg):  # seg cells in groups of 1, 2, 3, 4, 1, 2, ... cells
        cuts.append(min(len(seg), cuts[-1] + len(cuts) % 4 + 1))
    bundles = [
        [("xcal_train", job) for job in xcal[a:b]]
        for a, b in ((0, 1), (1, 3), (3, 6), (6, 7), (7, 8), (8, 10), (10, 14), (14, 15))
    ]
    assert sum(bundles, []) == [("xcal_train", job) for job in xcal]  # every run, once
    # (the efficientnet_b0 runs form one group: its memory is then a tight point)
    assert {job.wc["model"] for _, job in bundles[5]} == {"efficientnet_b0"}
    bundles += [[(rule, job) for job in seg[a:b] for rule in ("seg_train", "seg_attack")]
                for a, b in zip(cuts[:-1], cuts[1:], strict=True)]  # fmt: skip
    rows, logs_dir, largest = [], tmp_path / "slurm_logs", {}
    for i, members in enumerate(bundles):
        rules = sorted({rule for rule, _ in members})
        group = "xcal_run" if rules == ["xcal_train"] else "seg_cell"
        comment = f"rule_{group}_{'_'.join(rules)}"
        costs = [measures(rule, config, job) for rule, job in members]
        rows.append((comment, sum(c[0] for c in costs), max(c[1] for c in costs)))
        if i == 3:
            continue  # this group's log is lost
        log = logs_dir / f"group_{group}_{'_'.join(rules)}" / f"{i + 1}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        starts = [(k + 1, rule, job.wc) for k, (rule, job) in enumerate(members)]
        log.write_text(job_log(starts, serial(len(starts))))
        by_old = [job_cost.predict(rule, *job_cost.features(rule, config, job.wc, job.params),
                                   old) for rule, job in members]  # fmt: skip
        top = max(range(len(members)), key=lambda k: by_old[k].host_mb + by_old[k].compute_mb)
        rule, job = members[top]
        cell = f"{rule}/{efficiency_report.wildcard_values(job.study, job.wc)}"
        largest[cell] = (len(members), *rows[-1][1:])
    with open(REPORT, newline="") as f:
        header = next(csv.reader(f))
    crafted_report(tmp_path / "report.csv", header, rows)
    jobs = efficiency_report.read_jobs(tmp_path / "report.csv")
    logs = efficiency_report.group_logs([logs_dir])
    points, groups, skipped = efficiency_report.cost_points(jobs, config, grid, logs, old)

    assert [why.split(":")[0] for why in skipped] == ["job 4 (rule_xcal_run_xcal_train)"]
    assert "members are not named" in skipped[0]
    group_ids = [str(i + 1) for i, b in enumerate(bundles) if len(b) > 1]  # the others: points
    assert [g["job"].split()[0] for g in groups] == group_ids
    found = {p["cell"]: p["measured"] for rows in points.values() for p in rows}
    one_run = sum(len(b) == 1 for i, b in enumerate(bundles) if i != 3)  # (group 4: log lost)
    assert len(found) == one_run + len(groups)  # the one-run groups' points, a memory point a group
    for cell, (size, seconds, peak) in largest.items():
        assert found[cell] == ({"mem": peak, "time": seconds} if size == 1 else {"mem": peak})

    rules = ("xcal_train", "seg_train", "seg_attack")
    # (a rule without memory points keeps its old memory coefficients)
    saved = {"rules": {r: {"points": [], "mem": old["rules"][r]["mem"], "time": {}} for r in rules}}
    bench.refit_with(saved, "slurm", {r: {p["cell"]: p for p in ps} for r, ps in points.items()},
                     groups)  # fmt: skip
    assert saved["rules"]["xcal_train"]["time"] == pytest.approx(XCAL_TIME, rel=1e-6, abs=1e-9)
    assert saved["rules"]["xcal_train"]["mem"] == pytest.approx(XCAL_MEM, rel=1e-6)
    seg_time = {rule: saved["rules"][rule]["time"] for rule in SEG_TIME}
    for rule, coef in SEG_TIME.items():
        for model in ("unet", "unetpp", "infnet"):
            assert seg_time[rule][f"work_{model}"] == pytest.approx(coef[f"work_{model}"])
    assert sum(t["const"] for t in seg_time.values()) == pytest.approx(35.0)
    for job in seg:
        cell = [(rule, *job_cost.features(rule, config, job.wc, job.params)) for rule in SEG_TIME]
        new = sum(job_cost.predict(r, mem, time, saved).seconds for r, mem, time in cell)
        assert new == pytest.approx(sum(measures(r, config, job)[0] for r in SEG_TIME))
    assert saved["slurm_fit"]["groups"] == len(groups)
    for group in groups:
        mb, seconds = bench.group_prediction(group, saved)
        assert seconds == pytest.approx(group["measured"]["time"], rel=1e-6)
        assert mb >= group["measured"]["mem"] * (1 - 1e-9)
