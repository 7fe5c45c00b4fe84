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

Every point is one cell of the smoke config with sizes overridden (image size, width, batch,
patch, volume, model, ROAD sample); the smallest points have the smoke config's sizes. These
small runs alone extrapolate badly to the paper's sizes (deeper networks, 224² inputs,
per-sample gradients of large layers), so `--preflight DIR` adds what a preflight measured at
the configured sizes (`dpmed.preflight.points`: the peak, and the job's time projected from its
measured seconds per unit of work, the same runtime model as the fit's) as points of each
study's training rule (a cell probed again replaces its earlier point), recomputes every saved
point's features (a preflight point keeps its params and data for that) and refits the
coefficients, without rerunning the small cells.
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

from dpmed import job_cost
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
    was measured): a preflight point's from its params and data, a small run's from its config
    edit."""
    if point.get("source") == "preflight":
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
    """Add the preflight points of `folders` to the saved ones (a cell probed again replaces
    its earlier point, so one re-probed cell need not rerun the others), recompute every saved
    point's features, and refit every rule's memory and time coefficients over all its
    points."""
    found: dict[str, dict[str, dict]] = {}
    for folder in folders:
        for rule, rows in cost_points(folder).items():
            found.setdefault(rule, {}).update((row["cell"], row) for row in rows)
    for rule, entry in saved["rules"].items():
        new = found.get(rule, {})
        small = [p for p in entry["points"] if p.get("source") != "preflight"]
        kept = [p for p in entry["points"] if p.get("source") == "preflight"
                and p["cell"] not in new]  # fmt: skip
        for point in small + kept:
            point["mem"], point["time"] = features_of(rule, point)
        entry["points"] = small + kept + list(new.values())
        entry["mem"] = fit(entry["points"], "mem")
        entry["time"] = fit(entry["points"], "time")
    counts = {
        rule: sum(p.get("source") == "preflight" for p in entry["points"])
        for rule, entry in saved["rules"].items()
    }
    saved["preflight_fit"] = {"date": datetime.date.today().isoformat(), "points": counts}


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
