"""Fit the job cost model of `dpmed.job_cost`: one set of count functions (each study's sizing,
`dpmed.sizing`) and one coefficients file, fitted on every measured job at hand. Writes the
coefficients to src/dpmed/job_cost.json and the measured points, one line each, to
bench/job_cost_points.jsonl (a point keeps its job's rule, wildcards, params and data sections,
so every refit recomputes its features with the current sizing), then prints one line per
point (measured vs predicted peak MB and wall seconds), the least, median and largest ratio per
rule and source, and each coefficient before and after.

    PYTHONPATH=src python bench/job_cost.py                    # refit the saved points only
    PYTHONPATH=src python bench/job_cost.py --small [--rules fets_train]  # 20 min on 2 cores
    PYTHONPATH=src python bench/job_cost.py --preflight results/preflight
    PYTHONPATH=src python bench/job_cost.py --benchmarks WORKDIR ... [--configfile FILE ...] \
        [--out JSON]

The points come from three sources, all measured on CPU (a GPU job's RSS holds no activations
and its seconds are the GPU's); a job measured again (same rule, wildcards, params and data)
replaces its earlier point:

- `--benchmarks WORKDIR`: every training and attack job of a finished run, read from the
  Snakemake benchmark files in its `benchmarks/` folder (`--configfile`: the run's config).
  Every job writes its own, on a workstation or inside a SLURM job (a group job's members each
  theirs), so this reads the demo's jobs, a workstation's and a cluster's alike. The demo's
  jobs keep the prediction of a job of seconds within a small factor: without them the fit's
  constant came from the paper-size points and priced a job of seconds in many minutes.
- `--small`: one cell of each study run by the real workflow at several sizes (the smoke
  config with image size, width, batch, patch, volume, model or ROAD sample overridden), read
  as `--benchmarks` reads a run.
- `--preflight DIR`: what a preflight measured at the configured sizes
  (`dpmed.preflight.report.cost_points`: the probe's peak, and the job's time projected from
  its measured seconds per unit of work, the same runtime model as the fit's).
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
from typing import Any

import numpy as np
import yaml
from scipy.optimize import linprog, nnls
from snakemake.utils import update_config

from dpmed import job_cost
from dpmed.config.checks import check_config, load_configs
from dpmed.config.grid import wildcards_from_path
from dpmed.preflight.report import cost_points
from dpmed.sizing import sized_rules
from dpmed.studies import STUDIES

REPO = Path(__file__).resolve().parents[1]
POINTS_FILE = REPO / "bench" / "job_cost_points.jsonl"
SEG_MODELS = ("unet", "unetpp", "lfunet", "infnet")
KNOWN = ("host", "device")  # memory terms of known size (MB), not fitted
XCAL_MODELS = ("resnet18", "efficientnet_b0")
JOB = ("wildcards", "params", "data")  # what a point keeps of its job


def smoke() -> dict:
    """The smoke config without its audit cells (they name cells of the smoke grid, which each
    point replaces by its own one-cell grid)."""
    config = load_configs([REPO / "config" / "smoke.yaml"])
    config["audit"] = {"cells": []}
    return config


def job_of(study: str, config: dict, grid: Any, wc: dict) -> dict:
    """What a point keeps of one job of `study`: its wildcards, params and the data sections its
    wildcards name (the study's and its dataset's), all its features depend on."""
    data = {name: section for name, section in config["data"].items()
            if name == study or name in wc.values()}  # fmt: skip
    return {"wildcards": dict(wc), "params": grid.params(study, wc), "data": data}


def features_of(rule: str, job: dict) -> tuple[dict, dict]:
    """The cost features of a saved job (recomputed: the sizing may have changed since it was
    measured)."""
    return job_cost.features(rule, {"data": job["data"]}, job["wildcards"], job["params"])


def key(point: dict) -> str:
    """What makes two points the same job: its rule and its `JOB` fields."""
    return json.dumps([point["rule"], *(point[f] for f in JOB)], sort_keys=True)


def read_points(path: Path = POINTS_FILE) -> list[dict]:
    """The saved points (one JSON object a line), their features recomputed (`with_features`)."""
    if not path.exists():
        return []
    return [with_features(json.loads(line)) for line in path.read_text().splitlines() if line]


def with_features(point: dict) -> dict:
    """`point` with its features recomputed."""
    point["mem"], point["time"] = features_of(point["rule"], point)
    return point


def write_points(points: list[dict], path: Path) -> None:
    """`points` one a line, without their features (recomputed on reading)."""
    stored = [{k: v for k, v in p.items() if k not in ("mem", "time")} for p in points]
    path.write_text("".join(json.dumps(p, sort_keys=True, separators=(",", ":")) + "\n"
                            for p in stored))  # fmt: skip


def merged(saved: list[dict], new: list[dict]) -> list[dict]:
    """`saved` with `new` added, a job measured again keeping its newer point."""
    return list({key(p): p for p in [*saved, *new]}.values())


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


def points_to_measure() -> dict[str, list[tuple[dict, dict]]]:
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


def measure(study: str, edit: dict, wc: dict) -> list[dict]:
    """Run one cell of `study` in a fresh folder with the smoke config edited by `edit`: the
    points of its jobs (`benchmark_points`). The requests are set on the command line: the
    model being fitted does not run its own points."""
    config = smoke()
    update_config(config, copy.deepcopy(edit))
    run = STUDIES[study].path.format(**wc)
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
        return benchmark_points(work, config, "small")


def benchmark_points(folder: Path, config: dict, source: str) -> list[dict]:
    """A point of `source` for every job of a sized rule whose Snakemake benchmark file is in
    `folder`/benchmarks (`benchmarks/<rule>/<run>.tsv`): its peak RSS (`max_rss`, MB) and wall
    seconds (`s`), its job sized by `config` (the run's). Snakemake samples a job's memory at
    its start and then every `logging.benchmark_interval` seconds, so a job shorter than that
    interval has no peak (its `max_rss` is the start's) and gives its time only. The run must
    have been on CPU."""
    if config["device"] != "cpu":
        raise SystemExit(f"{folder}: a run on device {config['device']!r}; the model is fitted "
                         "on CPU jobs (a GPU job's RSS holds no activations)")  # fmt: skip
    grid = check_config(config, REPO / "config" / "schema.yaml")
    interval = float(config["logging"]["benchmark_interval"])
    out = []
    for rule, study in sized_rules().items():
        for tsv in sorted((Path(folder) / "benchmarks" / rule).glob("**/*.tsv")):
            run = tsv.relative_to(Path(folder) / "benchmarks" / rule).with_suffix("")
            wc = wildcards_from_path(study, f"results/{study}/{run.as_posix()}")
            header, values = tsv.read_text().splitlines()[:2]
            row = dict(zip(header.split("\t"), values.split("\t"), strict=True))
            measured = {"mem": float(row["max_rss"]), "time": float(row["s"])}
            if measured["time"] < interval:
                measured.pop("mem")
            out.append({"rule": rule, "source": source, **job_of(study, config, grid, wc),
                        "measured": measured})  # fmt: skip
    return [with_features(p) for p in out]


# Memory is fitted as an upper envelope: every measured peak at or below its prediction (a job
# over its request is killed), with the least total relative excess (the peaks span 300 MB to
# 15 GB: an absolute objective would let the large jobs decide). A least-squares fit leaves
# about half the points above their prediction, and the paper-size peaks vary from run to run
# by more than the preflight's headroom leaves for that. Time is fitted on relative residuals
# (each row divided by its measured seconds): the jobs span seconds to hours, and an absolute
# fit let the hours decide the constant, which then put 15 minutes on a 15-second demo job.
ENVELOPE = {"mem": True, "time": False}


def fit(rows: list[dict], kind: str) -> dict[str, float]:
    """Non-negative coefficients of the fitted features of `kind` (the known terms subtracted
    first), over the rows that measured `kind`: the least relative upper envelope of the
    measures (a linear programme) or the least-squares fit of the relative residuals
    (`ENVELOPE`)."""
    rows = [r for r in rows if kind in r["measured"]]
    names = sorted({n for r in rows for n in r[kind] if n not in KNOWN})
    a = np.array([[r[kind].get(n, 0.0) for n in names] for r in rows])
    b = np.array([r["measured"][kind] - sum(r[kind].get(n, 0.0) for n in KNOWN) for r in rows])
    weight = 1.0 / np.array([r["measured"][kind] for r in rows])
    scale = np.maximum(a.max(axis=0), 1e-12)  # column scaling for a well-posed programme
    a = a / scale
    if ENVELOPE[kind]:
        solved = linprog(weight @ a, A_ub=-a, b_ub=-b, bounds=(0, None), method="highs")
        if not solved.success:
            raise RuntimeError(f"no upper envelope of the {kind} points: {solved.message}")
        x = solved.x
    else:
        x, _ = nnls(a * weight[:, None], b * weight)
    return {n: float(v / s) for n, v, s in zip(names, x, scale, strict=True)}


def fit_all(points: list[dict]) -> dict[str, dict]:
    """rule → its fitted `mem` and `time` coefficients over its `points` (`fit`)."""
    rules = dict.fromkeys(p["rule"] for p in points)
    return {rule: {kind: fit([p for p in points if p["rule"] == rule], kind)
                   for kind in ("mem", "time")} for rule in rules}  # fmt: skip


def save(points: list[dict], out: Path = job_cost.COEFFICIENTS_FILE) -> dict:
    """Fit `points`, write the coefficients to `out` and the points beside them (the default
    `out`: to `POINTS_FILE`, else to `<out stem>_points.jsonl`); the model written."""
    counts: dict[str, dict[str, int]] = {}
    for point in points:
        source = counts.setdefault(point["source"], {})
        source[point["rule"]] = source.get(point["rule"], 0) + 1
    model = {
        "measured_on": {"date": datetime.date.today().isoformat(),
                        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU",
                        "python": platform.python_version()},
        "points": counts,
        "rules": fit_all(points),
    }  # fmt: skip
    out.write_text(json.dumps(model, indent=1, sort_keys=True) + "\n")
    default = out == job_cost.COEFFICIENTS_FILE
    write_points(points, POINTS_FILE if default else out.with_name(f"{out.stem}_points.jsonl"))
    job_cost.coefficients.cache_clear()
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true",
                        help="run the small cells of the --rules and add their points")  # fmt: skip
    parser.add_argument("--rules", nargs="*", default=list(sized_rules()))
    parser.add_argument("--preflight", nargs="*", type=Path, default=[], metavar="DIR",
                        help="add the points of these preflights")  # fmt: skip
    parser.add_argument("--benchmarks", nargs="*", type=Path, default=[], metavar="WORKDIR",
                        help="add the jobs of these finished runs (their benchmarks/)")  # fmt: skip
    parser.add_argument("--configfile", nargs="*", type=Path, default=[], metavar="FILE",
                        help="the --benchmarks runs' config files, merged as --configfile "
                        "(default config/config.yaml)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=job_cost.COEFFICIENTS_FILE,
                        help="where the model goes (default: %(default)s; elsewhere, its points "
                        "go beside it)")  # fmt: skip
    args = parser.parse_args(argv)
    old = json.loads(job_cost.COEFFICIENTS_FILE.read_text())
    points = read_points()
    for folder in args.preflight:
        points = merged(points, cost_points(folder))
    for folder in args.benchmarks:
        points = merged(points, benchmark_points(folder, load_configs(args.configfile), "run"))
    studies = dict.fromkeys(sized_rules()[rule] for rule in args.rules) if args.small else {}
    for study in studies:
        for edit, wc in points_to_measure()[study]:
            new = [p for p in measure(study, edit, wc) if p["rule"] in args.rules]
            for p in new:
                print(f"{p['rule']} {wc}: {p['measured'].get('mem', 0):.0f} MB, "
                      f"{p['measured']['time']:.1f} s", flush=True)  # fmt: skip
            points = merged(points, new)
            save(points, args.out)  # after every cell: a long run keeps what it measured
    report(points, old, save(points, args.out))


def spread(values: tuple[float, ...]) -> str:
    """least/median/largest of the finite `values` ('-' when none is)."""
    finite = [v for v in values if np.isfinite(v)]
    return "/".join(f"{f(finite):.2f}" for f in (min, np.median, max)) if finite else "-"


def report(points: list[dict], old: dict, new: dict) -> None:
    """One line per point: measured vs predicted peak MB and wall seconds (where measured), the
    ratio of the request (`MEM_MARGIN` × predicted) to the measured peak and of the predicted
    to the measured seconds; per rule and source the least, median and largest of those
    ratios; then each coefficient of the `old` and `new` model."""
    print(f"\n{'rule':<11} {'source':<9} {'cell':<44} {'peak MB':>8} {'pred':>7} {'req/peak':>8} "
          f"{'s':>8} {'pred':>8} {'pred/s':>6}")  # fmt: skip
    ratios: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in points:
        cost = job_cost.predict(row["rule"], row["mem"], row["time"], new)
        mem, sec = cost.host_mb + cost.compute_mb, cost.seconds
        measured = row["measured"]
        ratio = (job_cost.MEM_MARGIN * mem / measured.get("mem", float("nan")),
                 sec / measured.get("time", float("nan")))  # fmt: skip
        ratios.setdefault((row["rule"], row["source"]), []).append(ratio)
        print(
            f"{row['rule']:<11} {row['source']:<9} {'/'.join(row['wildcards'].values()):<44}"
            f" {measured.get('mem', float('nan')):8.0f} {mem:7.0f} {ratio[0]:8.2f}"
            f" {measured.get('time', float('nan')):8.1f} {sec:8.1f} {ratio[1]:6.2f}"
        )
    print(
        f"\n{'rule':<11} {'source':<9} {'jobs':>4}  req/peak min/median/max  pred/s min/median/max"
    )
    for (rule, source), rows in ratios.items():
        mem, sec = (spread(r) for r in zip(*rows, strict=True))
        print(f"{rule:<11} {source:<9} {len(rows):4d}  {mem:<23}  {sec}")
    print(f"\n{'rule':<11} {'coefficient':<26} {'old':>12} {'new':>12}")
    for rule, fitted in new["rules"].items():
        for kind in ("mem", "time"):
            for name, value in sorted(fitted[kind].items()):
                before = old["rules"].get(rule, {}).get(kind, {}).get(name, float("nan"))
                print(f"{rule:<11} {kind + ' ' + name:<26} {before:12.5g} {value:12.5g}")


if __name__ == "__main__":
    main()
