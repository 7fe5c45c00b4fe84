"""Fit the job cost model of `dpmed.job_cost`: run the real training and attack rules at several
sizes, read each job's peak RSS and wall seconds from its Snakemake benchmark file, and fit the
per-rule coefficients (memory: the least upper envelope of the peaks; time: non-negative least
squares). Writes src/dpmed/job_cost.json (the coefficients, the measured points and what the
fit predicts for each) and prints one line per point: measured vs predicted peak MB and wall
seconds.

    PYTHONPATH=src python bench/job_cost.py            # about 20 minutes on 2 cores
    PYTHONPATH=src python bench/job_cost.py --rules fets_train
    PYTHONPATH=src python bench/job_cost.py --preflight results/preflight
    PYTHONPATH=src python bench/job_cost.py --preflight     # refit the saved points only
    PYTHONPATH=src python bench/job_cost.py refit --efficiency-report FILE ... \
        [--slurm-logs DIR ...] [--configfile FILE ...] [--out JSON]

Every point is one cell of the smoke config with sizes overridden (image size, width, batch,
patch, volume, model, ROAD sample); the smallest points have the smoke config's sizes. These
small runs alone extrapolate badly to the paper's sizes (deeper networks, 224² inputs,
per-sample gradients of large layers), so `--preflight DIR` adds what a preflight measured at
the configured sizes (`dpmed.preflight.points`: the peak, and the job's time projected from its
measured seconds per unit of work, the same runtime model as the fit's) as points of each
study's training rule (a cell probed again replaces its earlier point), recomputes every saved
point's features (a preflight point keeps its params and data for that) and refits the
coefficients, without rerunning the small cells.

`refit --efficiency-report FILE ...` does the same with the jobs of real SLURM runs: the
efficiency reports the SLURM executor writes with `--slurm-efficiency-report`, or
`sacct --parsable2 -o JobID,Comment,Elapsed,MaxRSS` output (`dpmed.efficiency_report`; the
`--configfile` files are the runs' config, which sizes their jobs). Each measured job of a
training or attack rule becomes a point of its rule (its peak RSS and its wall seconds, the
job's start-up included; a cell measured again replaces its earlier point), every rule is
refitted, and the old and new coefficients and predictions are printed side by side. The jobs
must have run on CPUs: a GPU job's RSS holds no activations and its seconds are the GPU's.
A group job (several seg cells or xcal runs in one SLURM job) counts when `--slurm-logs DIR`
gives the executor's kept SLURM logs, which name its members: its elapsed seconds are one
equation over the sum of its members' time features (members that ran one after another), so
the time coefficients of the rules a group links (seg_train and seg_attack) are fitted jointly
(`fit_times`), and its peak is a memory point of the member with the largest predicted peak
(an upper bound of each member's: `dpmed.efficiency_report`).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import linprog, nnls
from snakemake.utils import update_config

from dpmed import efficiency_report, job_cost
from dpmed.config.checks import check_config, load_configs
from dpmed.preflight.points import cost_points
from dpmed.sizing import sized_rules
from dpmed.studies import STUDIES

REPO = Path(__file__).resolve().parents[1]
SEG_MODELS = ("unet", "unetpp", "lfunet", "infnet")
KNOWN = ("host", "device")  # memory terms of known size (MB), not fitted
XCAL_MODELS = ("resnet18", "efficientnet_b0")


def smoke() -> dict:
    """The smoke config without its audit cells (they name cells of the smoke grid, which each
    point replaces by its own one-cell grid)."""
    config = load_configs([REPO / "config" / "smoke.yaml"])
    config["audit"] = {"cells": []}
    return config


def features_of(rule: str, point: dict) -> tuple[dict, dict]:
    """The cost features of a saved point, recomputed (the features may have changed since it
    was measured): a preflight's or SLURM job's point from its params and data, a small run's
    from its config edit."""
    if point.get("source") in ("preflight", "slurm"):
        return job_cost.features(rule, {"data": point["data"]}, point["wildcards"],
                                 point["params"])  # fmt: skip
    config = smoke()
    update_config(config, copy.deepcopy(point["edit"]))
    study = sized_rules()[rule]
    hp = check_config(config, REPO / "config" / "schema.yaml").params(study, point["wildcards"])
    return job_cost.features(rule, config, point["wildcards"], hp)


def seg_point(model: str, size: int, width: int, batch: int) -> tuple[dict, dict]:
    edit = {
        "data": {"duke": {"size": [size, size]}},
        "seg": {"defaults": {"width": width, "batch_size": batch, "epochs": 1, "depth": 3},
                "grid": [{"datasets": ["duke"], "models": [model], "clips": ["flat"],
                          "morphs": ["none"], "eps": [10], "seeds": [0]}]},
    }  # fmt: skip
    wc = {"dataset": "duke", "model": model, "clip": "flat", "morph": "none", "eps": "10",
          "seed": "0"}  # fmt: skip
    return edit, wc


def fets_point(filters: int, patch: int, shape: list[int]) -> tuple[dict, dict]:
    edit = {
        "data": {"fets": {"synthetic": {"shape": shape}}},
        "fets": {"defaults": {"base_filters": filters, "patch_size": [patch] * 3, "rounds": 2},
                 "grid": [{"aggregators": ["dp_simagg"], "dpmodes": ["sound"], "eps": [10],
                           "seeds": [0]}]},
    }  # fmt: skip
    return edit, {"aggregator": "dp_simagg", "dpmode": "sound", "eps": "10", "seed": "0"}


def xcal_point(model: str, size: int, scale: float, road: int = 16) -> tuple[dict, dict]:
    edit = {
        "data": {"bloodmnist": {"size": size}},
        "xcal": {"defaults": {"width_scale": scale, "road_subsample": road},
                 "grid": [{"datasets": ["bloodmnist"], "models": [model], "methods": ["static"],
                           "shifts": ["iid"], "clients": [3], "eps": [5], "seeds": [0]}]},
    }  # fmt: skip
    wc = {"dataset": "bloodmnist", "model": model, "method": "static", "shift": "iid",
          "clients": "3", "eps": "5", "seed": "0"}  # fmt: skip
    return edit, wc


def points() -> dict[str, list[tuple[dict, dict]]]:
    """study → (config edit, wildcards) of every measured cell."""
    sizes = ((32, 4, 8), (128, 16, 8), (64, 8, 16))  # image side, width, batch
    seg = [seg_point(m, s, w, b) for m in SEG_MODELS for s, w, b in sizes]
    return {
        "seg": seg,
        "fets": [
            fets_point(4, 16, [32, 32, 24]),
            fets_point(8, 32, [48, 48, 40]),
            fets_point(8, 16, [64, 64, 48]),
            fets_point(4, 24, [56, 56, 40]),
        ],  # fmt: skip
        "xcal": [xcal_point(m, s, k) for m in XCAL_MODELS for s, k in ((28, 0.125), (64, 0.5))]
        + [xcal_point(m, 64, 0.5, road=60) for m in XCAL_MODELS],
    }


# The last file each study's cell writes: a seg attack needs the training, so one run of the
# seg cell measures both seg rules.
TARGETS = {"seg": "attack.json", "fets": "privacy.json", "xcal": "privacy.json"}


def measure(study: str, edit: dict, wc: dict) -> tuple[dict, dict, dict[str, tuple[float, float]]]:
    """Run one cell of `study` in a fresh folder: (resolved config, the cell's hyperparameters,
    rule → (peak MB, wall s)).
    The requests are set on the command line: the model being fitted does not run its own
    points."""
    config = smoke()
    update_config(config, copy.deepcopy(edit))
    run = STUDIES[study].path.format(**wc)
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        subprocess.run(
            [sys.executable, "-m", "snakemake", f"{run}/{TARGETS[study]}",
             "--snakefile", str(REPO / "Snakefile"), "--directory", str(work),
             "--configfile", str(work / "config.yaml"), "--cores", "2", "--quiet", "all",
             "--set-resources",
             *(f"{r}:{k}=1" for r in sized_rules() for k in ("mem_mb", "runtime"))],
            check=True, cwd=REPO,
        )  # fmt: skip
        for rule, rule_study in sized_rules().items():
            tsv = work / f"benchmarks/{rule}/{run.removeprefix(f'results/{study}/')}.tsv"
            if rule_study == study and tsv.exists():
                header, values = tsv.read_text().splitlines()[:2]
                row = dict(zip(header.split("\t"), values.split("\t"), strict=True))
                measured[rule] = (float(row["max_rss"]), float(row["s"]))
    hp = check_config(config, REPO / "config" / "schema.yaml").params(study, wc)
    return config, hp, measured


# Memory is fitted as an upper envelope: every measured peak at or below its prediction (a job
# over its request is killed), with the least total relative excess (the peaks span 300 MB to
# 15 GB: an absolute objective would let the large jobs decide). A least-squares fit leaves
# about half the points above their prediction, and the paper-size peaks vary from run to run
# by more than the preflight's headroom leaves for that. Time is fitted on absolute residuals:
# the large jobs' hours are what a request must get right, the small jobs' seconds sit under
# the request's floor (`job_cost.TIME_FLOOR_MIN`) whatever the fit says, and a job cut off by
# its time limit resumes from its checkpoint.
ENVELOPE = {"mem": True, "time": False}


def fit(rows: list[dict], kind: str) -> dict[str, float]:
    """Non-negative coefficients of the fitted features of `kind` (the known terms subtracted
    first), over the rows that measured `kind`: the least relative upper envelope of the
    measures (a linear programme) or the least-squares fit (`ENVELOPE`)."""
    rows = [r for r in rows if kind in r["measured"]]
    names = sorted({n for r in rows for n in r[kind] if n not in KNOWN})
    a = np.array([[r[kind].get(n, 0.0) for n in names] for r in rows])
    b = np.array([r["measured"][kind] - sum(r[kind].get(n, 0.0) for n in KNOWN) for r in rows])
    scale = np.maximum(a.max(axis=0), 1e-12)  # column scaling for a well-posed programme
    a = a / scale
    if ENVELOPE[kind]:
        weight = 1.0 / np.array([r["measured"][kind] for r in rows])
        solved = linprog(weight @ a, A_ub=-a, b_ub=-b, bounds=(0, None), method="highs")
        if not solved.success:
            raise RuntimeError(f"no upper envelope of the {kind} points: {solved.message}")
        x = solved.x
    else:
        x, _ = nnls(a, b)
    return {n: float(v / s) for n, v, s in zip(names, x, scale, strict=True)}


def main() -> None:
    if sys.argv[1:2] == ["refit"]:
        refit_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="*", default=list(sized_rules()))
    parser.add_argument(
        "--preflight", nargs="*", type=Path, default=None, metavar="DIR",
        help="refit from the saved points and the peaks these preflights measured (module "
        "docstring); with no DIR, refit from the saved points only",
    )  # fmt: skip
    args = parser.parse_args()
    out = job_cost.COEFFICIENTS_FILE
    saved = json.loads(out.read_text()) if out.exists() else {"rules": {}}
    if args.preflight is not None:
        refit_with_preflight(saved, args.preflight)
        out.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
        job_cost.coefficients.cache_clear()
        report(saved, list(saved["rules"]))
        return
    rows: dict[str, list[dict]] = {rule: [] for rule in args.rules}
    for study in dict.fromkeys(sized_rules()[rule] for rule in args.rules):
        for edit, wc in points()[study]:
            config, hp, measured = measure(study, edit, wc)
            for rule in (r for r in args.rules if r in measured):
                mem, time = job_cost.features(rule, config, wc, hp)
                peak, seconds = measured[rule]
                rows[rule].append({"wildcards": wc, "edit": edit, "mem": mem, "time": time,
                                   "measured": {"mem": peak, "time": seconds}})  # fmt: skip
                print(f"{rule} {wc}: {peak:.0f} MB, {seconds:.1f} s", flush=True)
        for rule in (r for r in args.rules if sized_rules()[r] == study):  # saved per study
            saved["rules"][rule] = {
                "mem": fit(rows[rule], "mem"),
                "time": fit(rows[rule], "time"),
                "points": rows[rule],
            }
        saved["measured_on"] = {
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU",
            "python": platform.python_version(),
        }
        out.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
    job_cost.coefficients.cache_clear()
    report(saved, args.rules)


def refit_with_preflight(saved: dict, folders: list[Path]) -> None:
    """Add the preflight points of `folders` to the saved ones and refit (`refit_with`)."""
    found: dict[str, dict[str, dict]] = {}
    for folder in folders:
        for rule, rows in cost_points(folder).items():
            found.setdefault(rule, {}).update((row["cell"], row) for row in rows)
    refit_with(saved, "preflight", found)


def refit_with(
    saved: dict, source: str, found: dict[str, dict[str, dict]], groups: list[dict] | None = None
) -> None:
    """Add the points `found` (rule → cell → point of `source`) and the group time points
    `groups` (`dpmed.efficiency_report.cost_points`) to the saved ones (a cell or group measured
    again replaces its earlier point of that source, so one re-measured cell need not rerun the
    others), recompute every saved point's features, and refit every rule's memory and time
    coefficients over all its points (`fit_times`)."""
    for rule, entry in saved["rules"].items():
        new = found.get(rule, {})
        kept = [p for p in entry["points"] if p.get("source") != source or p["cell"] not in new]
        for point in kept:
            point["mem"], point["time"] = features_of(rule, point)
        entry["points"] = kept + list(new.values())
        if any("mem" in p["measured"] for p in entry["points"]):  # else kept as it was
            entry["mem"] = fit(entry["points"], "mem")
    new_groups = {group["cell"]: group for group in groups or []}
    kept = [g for g in saved.get("groups", []) if g["cell"] not in new_groups]
    for member in (m for group in kept for m in group["members"]):
        member["mem"], member["time"] = features_of(member["rule"], member)
    if kept or new_groups:
        saved["groups"] = kept + list(new_groups.values())
    fit_times(saved)
    counts = {
        rule: sum(p.get("source") == source for p in entry["points"])
        for rule, entry in saved["rules"].items()
    }
    saved[f"{source}_fit"] = {"date": datetime.date.today().isoformat(), "points": counts}
    if new_groups:
        saved[f"{source}_fit"]["groups"] = len(new_groups)


def linked_rules(rules: list[str], groups: list[dict]) -> list[set[str]]:
    """The rules in sets that no group job crosses: two rules are in one set when a group job
    ran jobs of both (seg_train and seg_attack in a seg cell's group)."""
    parts: list[set[str]] = []
    for linked in [{rule} for rule in rules] + [{m["rule"] for m in g["members"]} for g in groups]:
        touching = [part for part in parts if part & linked]
        parts = [part for part in parts if not part & linked] + [linked.union(*touching)]
    return parts


def fit_times(saved: dict) -> None:
    """Fit the time coefficients of every set of `linked_rules` by one least-squares fit over
    the features named (rule, feature): a job's row has its own rule's features, a group job's
    row the sum of its members' (its elapsed seconds are the sum of theirs, and the time is
    linear in the coefficients). A rule that no group links is fitted on its points alone, as
    before."""
    groups = saved.get("groups", [])
    for rules in linked_rules(list(saved["rules"]), groups):
        rows = [{"time": {(rule, n): v for n, v in p["time"].items()}, "measured": p["measured"]}
                for rule in rules for p in saved["rules"][rule]["points"]]  # fmt: skip
        for group in (g for g in groups if g["members"][0]["rule"] in rules):
            summed: dict[tuple[str, str], float] = {}
            for member in group["members"]:
                for name, value in member["time"].items():
                    key = (member["rule"], name)
                    summed[key] = summed.get(key, 0.0) + value
            rows.append({"time": summed, "measured": group["measured"]})
        if not any("time" in row["measured"] for row in rows):
            continue  # kept as they were
        fitted = fit(rows, "time")
        for rule in rules:
            saved["rules"][rule]["time"] = {n: v for (r, n), v in fitted.items() if r == rule}


def refit_main(argv: list[str]) -> None:
    """`bench/job_cost.py refit`: refit on the jobs of SLURM efficiency reports or sacct output
    (module docstring) and print the old and new model side by side."""
    parser = argparse.ArgumentParser(
        prog="bench/job_cost.py refit",
        description="refit the job cost model on the jobs of real SLURM runs",
    )
    parser.add_argument(
        "--efficiency-report", nargs="+", type=Path, required=True, metavar="FILE",
        help="efficiency_report_<run uuid>.csv of --slurm-efficiency-report, or the output of "
        "sacct --parsable2 -o JobID,Comment,Elapsed,MaxRSS (header line kept)",
    )  # fmt: skip
    parser.add_argument(
        "--slurm-logs", nargs="*", type=Path, default=[], metavar="DIR",
        help="the executor's SLURM logs of the runs (--slurm-keep-successful-logs; folder "
        "--slurm-logdir, default .snakemake/slurm_logs): they name a group job's members",
    )  # fmt: skip
    parser.add_argument(
        "--configfile", nargs="*", type=Path, default=[], metavar="FILE",
        help="the runs' config files, merged as --configfile (default config/config.yaml)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=job_cost.COEFFICIENTS_FILE,
                        help="where the refitted model goes (default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    config = load_configs(args.configfile)
    grid = check_config(config, REPO / "config" / "schema.yaml", args.configfile)
    jobs = [job for path in args.efficiency_report for job in efficiency_report.read_jobs(path)]
    old = copy.deepcopy(job_cost.coefficients())
    logs = efficiency_report.group_logs(args.slurm_logs)
    points, groups, skipped = efficiency_report.cost_points(jobs, config, grid, logs, old)
    skipped += [f"{len(rows)} jobs of {rule}: not fitted yet (bench/job_cost.py --rules {rule})"
                for rule, rows in points.items() if rule not in old["rules"]]  # fmt: skip
    points = {rule: rows for rule, rows in points.items() if rule in old["rules"]}
    for why in skipped:
        print(f"left out: {why}")
    new = copy.deepcopy(old)
    found = {rule: {p["cell"]: p for p in rows} for rule, rows in points.items()}
    refit_with(new, "slurm", found, groups)
    args.out.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    side_by_side(old, new, points, groups)


def side_by_side(old: dict, new: dict, points: dict[str, list[dict]], groups: list[dict]) -> None:
    """Per rule with measured jobs: each coefficient before and after the refit, then each
    job's measured peak MB and wall seconds beside the old and new model's predictions (a group
    job's memory point has no seconds); then each group job's seconds beside the sum of its
    members' predicted seconds and its peak beside the largest predicted member peak."""
    for rule in dict.fromkeys([*points, *(m["rule"] for g in groups for m in g["members"])]):
        rows = points.get(rule, [])
        print(f"\n{rule}: {len(rows)} measured jobs, {len(new['rules'][rule]['points'])} points")
        print(f"  {'coefficient':<26} {'old':>12} {'new':>12}")
        for kind in ("mem", "time"):
            for name in sorted(new["rules"][rule][kind]):
                before = old["rules"][rule][kind].get(name, float("nan"))
                print(f"  {kind + ' ' + name:<26} {before:12.5g} "
                      f"{new['rules'][rule][kind][name]:12.5g}")  # fmt: skip
        print(f"  {'job':<44} {'peak MB':>8} {'old':>7} {'new':>7} {'s':>7} {'old':>7} {'new':>7}")
        for row in rows:
            was, now = (job_cost.predict(rule, row["mem"], row["time"], model)
                        for model in (old, new))  # fmt: skip
            measured = row["measured"]
            print(
                f"  {'/'.join(row['wildcards'].values()):<44} {measured['mem']:8.0f}"
                f" {was.host_mb + was.compute_mb:7.0f} {now.host_mb + now.compute_mb:7.0f}"
                f" {measured.get('time', float('nan')):7.1f} {was.seconds:7.1f}"
                f" {now.seconds:7.1f}"
            )
    if groups:
        print(f"\n{'group job':<44} {'jobs':>4} {'peak MB':>8} {'old':>7} {'new':>7} {'s':>7}"
              f" {'old':>7} {'new':>7}")  # fmt: skip
    for group in groups:
        (was_mb, was_s), (now_mb, now_s) = (group_prediction(group, m) for m in (old, new))
        measured = group["measured"]
        print(f"{group['job']:<44} {len(group['members']):4d} {measured['mem']:8.0f}"
              f" {was_mb:7.0f} {now_mb:7.0f} {measured['time']:7.1f} {was_s:7.1f}"
              f" {now_s:7.1f}")  # fmt: skip


def group_prediction(group: dict, model: dict) -> tuple[float, float]:
    """(largest member peak MB, summed member seconds) that `model` predicts for a group job:
    what Snakemake's group request takes of its members' requests (memory: the largest; time:
    the sum)."""
    costs = [job_cost.predict(m["rule"], m["mem"], m["time"], model) for m in group["members"]]
    return max(c.host_mb + c.compute_mb for c in costs), sum(c.seconds for c in costs)


def report(saved: dict, rules: list[str]) -> None:
    """One line per point: measured vs predicted peak MB (and wall seconds, where measured),
    and the ratio of the request (`MEM_MARGIN` × predicted) to the measured peak."""
    print(f"\n{'rule':<11} {'cell':<52} {'peak MB':>8} {'pred':>7} {'req/peak':>8} "
          f"{'s':>7} {'pred':>7}")  # fmt: skip
    for rule in rules:
        for row in saved["rules"][rule]["points"]:
            cost = job_cost.predict(rule, row["mem"], row["time"])
            mem, sec = cost.host_mb + cost.compute_mb, cost.seconds
            cell = "/".join(row["wildcards"].values())
            measured = row["measured"]
            ratio = job_cost.MEM_MARGIN * mem / measured["mem"]
            print(
                f"{rule:<11} {cell:<52} {measured['mem']:8.0f} {mem:7.0f} {ratio:8.2f}"
                f" {measured.get('time', float('nan')):7.1f} {sec:7.1f}"
            )


if __name__ == "__main__":
    main()
