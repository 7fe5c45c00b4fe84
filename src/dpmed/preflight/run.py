"""`python -m dpmed.preflight`: probe every distinct cell of a grid and project its cost.

    python -m dpmed.preflight [--config FILE ...] [--sample] [--studies seg fets xcal]
                              [--out results/preflight] [--steps 2] [--timeout 1800]

`--config` files merge as Snakemake's `--configfile` (default config/config.yaml); `--sample`
probes only a covering subset (every model, method and ε; `sample_cells`). Writes into
`--out`: preflight.csv (+ .md, .html), cost.csv (+ .md, .html), cost.png/.pdf, and the probes'
logs under logs/. Exits 1 when a cell fails: its probe raised or its child died, a σ could not
be calibrated or gives ε above the target, or its measured peak does not fit the rule's memory
request with `FIT_MARGIN` (docs/preflight.md).

Distinct cells: a job's cost per step and its memory depend on what it builds and runs, not on
its seed or its learning rate, and its privacy budget ε changes only the noise multiplier σ (a
scalar): the tensors, their shapes and the code path are the same at every finite ε. So jobs
are grouped by a *shape key* and one representative per group is timed and memory-probed; σ is
still calibrated for every distinct ε of the group (`Cell.eps`), and each cell keeps its own
rows (σ calibrated for its ε, its own requests checked). What the key keeps, which cells share
one probe (`probe_key`: cells that differ only in scalars of the same computation) and which
part of a probe no method changes (`shared_key`) each study's sizing says
(`dpmed.sizing.StudySizing`, in `<study>/sizing.py`); this module iterates over the study
registry.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpmed.config.grid import Grid, job_seed
from dpmed.config.wildcards import parse_eps
from dpmed.io import write_text
from dpmed.job_cost import predicted, request
from dpmed.preflight.study import (
    CELL_FILE,
    Calibration,
    Cell,
    calibrate,
    probe_key,
    rule_jobs,
    shared_key,
    study_probe,
    study_rules,
)
from dpmed.sizing import study_sizing

if TYPE_CHECKING:
    import pandas as pd

FIT_MARGIN = 1.2  # a peak fits when FIT_MARGIN × peak ≤ the request (20 % headroom)
DEFAULT_STEPS = 2
DEFAULT_TIMEOUT = 1800.0  # seconds per probe child
# Rules probed in the same child as training (the seg attack scores the trained network): the
# child's peak is training's, an upper bound of theirs, so only a fit is conclusive.
SHARED_PEAK = ("seg_attack",)


def distinct_cells(grid: Grid, studies: Iterable[str] | None = None) -> list[Cell]:
    """The distinct cells of `grid` (of `studies`; default every study with a probe,
    `study_rules`), in grid order; every job is in exactly one. A cell's key is that of jobs
    that build the same tensors and run the same code: the study and its sizing's
    `shape_key`."""
    cells: dict[tuple, Cell] = {}
    for study in study_rules() if studies is None else studies:
        for job in grid.jobs(study):
            key = (study, *study_sizing(study).shape_key(job.wc, job.params))
            cell = cells.setdefault(key, Cell(study, key, job))
            cell.jobs.append(job)
    return list(cells.values())


def _features(cell: Cell) -> set[tuple[str, str]]:
    """What a cell shows the sample: its sizing's `sample_features` (models, methods) and the
    ε of its jobs."""
    sizing = study_sizing(cell.study)
    out: set[tuple[str, str]] = set()
    for job in cell.jobs:
        names = [*sizing.sample_features(cell.key[1:], job.wc), f"eps={parse_eps(job.wc['eps']):g}"]
        out |= {(cell.study, name) for name in names}
    return out


def sample_cells(cells: Sequence[Cell]) -> list[Cell]:
    """A small subset of `cells` that still shows every model, every method and every ε of
    each study (`_features`): greedy set cover, taking the cell that adds the most unseen
    features (ties: grid order); returned in grid order."""
    missing = set().union(*(_features(c) for c in cells)) if cells else set()
    chosen: list[Cell] = []
    while missing:
        best = max(cells, key=lambda c: len(_features(c) & missing))
        chosen.append(best)
        missing -= _features(best)
    order = {id(c): i for i, c in enumerate(cells)}
    return sorted(chosen, key=lambda c: order[id(c)])


def nearest(cell: Cell, probed: Sequence[Cell]) -> Cell | None:
    """The probed cell of `cell`'s study most like it: the one whose cost features (what a
    cell's cost per step depends on, most first: its sizing's `cost_features`) match `cell`'s,
    feature by feature in order, compared lexicographically (the same dataset first, then
    model, ...; the first in `probed` on ties); None when no cell of the study was probed."""
    sizing = study_sizing(cell.study)
    mine = sizing.cost_features(cell.key[1:], cell.job.params)

    def matches(other: Cell) -> tuple[bool, ...]:
        theirs = sizing.cost_features(other.key[1:], other.job.params)
        return tuple(a == b for a, b in zip(mine, theirs, strict=True))

    candidates = [c for c in probed if c.study == cell.study]
    return max(candidates, key=matches) if candidates else None


def prepare_data(config: Mapping[str, Any], cells: Sequence[Cell], folder: Path) -> dict[str, Path]:
    """Write the stand-in processed data the probes of `cells` read (`StudyProbe.write_data`,
    once per data name); returns the folder of each data name."""
    out: dict[str, Path] = {}
    for cell in cells:
        study = study_probe(cell.study)
        if study.data_name is None:
            continue
        name = study.data_name(cell.job.wc)
        if name not in out:
            out[name] = study.write_data(config, name, folder / name)
    return out


def run_child(spec: dict[str, Any], work: Path, timeout: float) -> dict[str, Any]:
    """Run `spec`'s probe in a child process (its own peak memory), its `wall_seconds` added; a
    child that dies, or outlives `timeout` seconds, is an error result."""
    start = time.perf_counter()
    result = _child_result(spec, work, timeout)
    result["wall_seconds"] = time.perf_counter() - start
    return result


def _child_result(spec: dict[str, Any], work: Path, timeout: float) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = work / "spec.json", work / "result.json"
    result_path.unlink(missing_ok=True)
    write_text(spec_path, json.dumps(spec, default=str))
    command = [sys.executable, "-m", "dpmed.preflight.study", str(spec_path), str(result_path)]
    with open(work / "probe.log", "w") as log:
        try:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout, check=False).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"status": "error", "message": f"probe exceeded {timeout:g} s"}
    if not result_path.is_file():
        return {"status": "error", "message": f"probe child exited with code {code} "
                f"(killed for memory if -9); log: {work / 'probe.log'}"}  # fmt: skip
    return json.loads(result_path.read_text())


def probe_cell(
    config: Mapping[str, Any], cell: Cell, device: str, data: Mapping[str, Path], work: Path,
    steps: int, timeout: float, shared: dict[tuple, dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """The measures of `cell`'s representative job: its study's probe parts
    (`StudyProbe.parts`), each in its own child. A part no method changes runs once, kept in
    `shared` under the cell's `shared_key` (fets: the collaborators' training and validation,
    once per network, the cell's own child running the server's aggregation; xcal: the test
    evaluation and ROAD, the cell's own child running the local steps). A shared part's peak
    counts in every cell it serves: the job runs every part in one process, one after the
    other."""
    job, study = cell.job, study_probe(cell.study)
    name = None if study.data_name is None else study.data_name(job.wc)
    spec = {"study": cell.study, "wildcards": job.wc, "params": dict(job.params),
            "seed": job_seed(cell.study, job.wc), "device": device, "steps": steps,
            "config": {"data": config["data"]}, "work_dir": str(work),
            "data_dir": str(work if name is None else data[name])}  # fmt: skip
    parts = []
    for part in study.parts:
        child = spec | {"probe": part.probe}
        if not part.shared:
            parts.append((part.folder, run_child(child, work / part.folder, timeout), True))
            continue
        key = shared_key(cell)
        ran = key not in shared
        if ran:
            shared[key] = run_child(child, work / part.folder, timeout)
        parts.append((part.folder, shared[key], ran))
    return _merged(*parts)


def _merged(*parts: tuple[str, dict[str, Any], bool]) -> dict[str, Any]:
    """One cell's measures from (name, measures, ran for this cell) parts, later parts winning
    a key both have: the peak is the largest, the wall time the parts run for this cell, and
    an error of any part makes the cell's error."""
    merged: dict[str, Any] = {}
    for _, measures, _ in parts:
        merged |= measures
    merged["device"] = parts[0][1].get("device", "")
    for peak in ("peak_rss_mb", "peak_cuda_mb"):
        measured = [m[peak] for _, m, _ in parts if peak in m]
        if measured:
            merged[peak] = max(measured)
    merged["wall_seconds"] = sum(m["wall_seconds"] for _, m, ran in parts if ran)
    errors = [(f"{name}: " if name else "") + m.get("message", "probe failed")
              for name, m, _ in parts if m.get("status") != "ok"]  # fmt: skip
    merged["status"] = "error" if errors else "ok"
    if errors:
        merged["message"] = "; ".join(errors)
    return merged


def write_cell(
    path: Path, config: Mapping[str, Any], cell: Cell, measures: Mapping[str, Any]
) -> None:  # fmt: skip
    """`CELL_FILE`: the representative job (study, wildcards, params, the data section) and
    its measures, merged over the cell's probes (`dpmed.preflight.report.cost_points` reads it)."""
    job = cell.job
    record = {"study": cell.study, "cell": cell.name, "wildcards": job.wc,
              "params": dict(job.params), "data": config["data"], "measures": measures}  # fmt: skip
    write_text(path, json.dumps(record, indent=1, default=str))


def cell_rows(
    config: Mapping[str, Any], cell: Cell, calibrations: Sequence[Calibration],
    measures: Mapping[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """preflight.csv's rows of `cell`: one per rule and ε, with the job-cost model's peak and
    minutes (on the CPU it was fitted on, before the request's margins) for the largest and the
    slowest of the rule's jobs at that ε (NaN: a rule not fitted)."""
    from dpmed.preflight.report import measured_seconds, step_measure

    gpu = measures.get("device") == "cuda"
    ok = measures.get("status") == "ok"
    rows = []
    for rule in study_rules()[cell.study]:
        for cal in calibrations:
            jobs = [j for j in rule_jobs(cell, rule) if parse_eps(j.wc["eps"]) == cal.eps]
            if not jobs:
                continue
            req = request(rule, config, jobs[0].wc, jobs[0].params, gpu=gpu)
            costs = [predicted(rule, config, job.wc, job.params) for job in jobs]
            predicted_peak = max(peak for peak, _ in costs)
            predicted_min = max(seconds for _, seconds in costs) / 60
            peak = measures.get("peak_rss_mb", math.nan)
            fits = ok and peak * FIT_MARGIN <= req.mem_mb
            if gpu and ok:
                fits = fits and measures.get("peak_cuda_mb", 0) * FIT_MARGIN <= req.gpu_mb
            minutes = math.nan
            if ok:
                minutes = max(measured_seconds(rule, config["data"], j.wc, j.params, measures)[1]
                              for j in jobs) / 60  # fmt: skip
            problems = []
            if not ok:
                problems.append(measures.get("message", "probe failed"))
            if cal.ok is False:
                problems.append(f"calibration: {cal.note}")
            if rule in SHARED_PEAK and ok and not fits:
                fits = None  # the probe's peak is training's: not this rule's own
            if ok and fits is False:
                problems.append(f"peak {peak:.0f} MB × {FIT_MARGIN} > request {req.mem_mb} MB")
            rows.append({
                "cell": cell.name, "study": cell.study, "rule": rule, "eps": cal.eps,
                "jobs": len(jobs), "status": "error" if problems else "ok",
                "message": "; ".join(problems), "sigma_min": cal.sigma_min,
                "sigma_max": cal.sigma_max, "eps_accounted": cal.accounted, "eps_ok": cal.ok,
                "device": measures.get("device", ""),
                "s_per_step": measures.get(step_measure(rule, config["data"], jobs[0].wc,
                                                        jobs[0].params), math.nan),
                "peak_rss_mb": peak, "predicted_peak_mb": predicted_peak,
                "peak_cuda_mb": measures.get("peak_cuda_mb", math.nan),
                "parameters": measures.get("parameters", math.nan),
                "mem_mb": req.mem_mb, "runtime_min": req.runtime, "gpu_mb": req.gpu_mb,
                "fits_mem": fits, "projected_min": minutes, "job_cost_min": predicted_min,
                "fits_time": ok and minutes <= req.runtime,
            })  # fmt: skip
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dpmed.preflight",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        nargs="*",
        default=[],
        metavar="FILE",
        help="config files, merged as --configfile (default config/config.yaml)",
    )
    parser.add_argument(
        "--sample", action="store_true", help="probe a covering sample: every model, method and ε"
    )
    parser.add_argument(
        "--studies",
        nargs="+",
        choices=list(study_rules()),
        default=list(study_rules()),
        help="probe these studies only (default: all)",
    )
    parser.add_argument("--out", type=Path, default=Path("results/preflight"))
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help="timed training steps per probe (the first is not counted)",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per probe")
    return parser.parse_args(argv)


def preflight_mode(value: bool | str) -> str:
    """The config's `preflight` value as `off`, `all` or `sample` (`--config preflight=true`
    passes the string "true")."""
    if value == "sample":
        return "sample"
    return "all" if value in (True, "true") else "off"


def preflight_request(
    config: Mapping[str, Any], grid: Grid, sample: bool, gpu: bool
) -> tuple[int, int]:  # fmt: skip
    """(mem_mb, runtime in minutes) a preflight job asks the scheduler for: the largest
    request of any probed cell's rules (a probe that needs more fails its cell anyway), and
    every probe's time limit, capped at `resources.max_runtime`."""
    cells = distinct_cells(grid)
    probed = sample_cells(cells) if sample else cells
    probes = len({probe_key(cell) for cell in probed})
    mem = max(request(rule, config, cell.job.wc, cell.job.params, gpu=gpu).mem_mb
              for cell in probed for rule in study_rules()[cell.study])  # fmt: skip
    limit = float(config.get("resources", {}).get("max_runtime", math.inf))
    return mem, math.ceil(min(limit, probes * DEFAULT_TIMEOUT / 60))


def run_preflight(
    config: Mapping[str, Any], grid: Grid, out: Path, *, sample: bool = False,
    studies: Sequence[str] | None = None, steps: int = DEFAULT_STEPS,
    timeout: float = DEFAULT_TIMEOUT,
) -> pd.DataFrame:  # fmt: skip
    """Probe the distinct cells of `grid` (or their covering sample) and write preflight.csv,
    cost.csv and cost.png (with their .md/.html/.pdf twins) into `out`; prints a progress line
    per cell with the ETA. Cells of one `probe_key` share the first one's probe (their
    measures name it in `measured_by`); each is still calibrated and checked against its own
    requests. Returns the rows of preflight.csv whose status is not ok."""
    import pandas as pd

    # pandas and matplotlib: kept out of the Snakefile, which imports this module
    from dpmed.preflight.report import cost_frame, labelled, plot_cost
    from dpmed.report.style import set_scale, write_table

    set_scale(config["data"])  # a projection of a synthetic grid is marked as such
    cells = distinct_cells(grid, studies)
    probed = sample_cells(cells) if sample else cells
    device = str(config["device"])  # the probes' device: `auto` resolved on this machine
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    jobs = sum(len(c.jobs) for c in cells)
    keys = [probe_key(cell) for cell in probed]
    print(f"preflight: {jobs} jobs in {len(cells)} distinct cells; checking {len(probed)} in "
          f"{len(set(keys))} probes on {device}", flush=True)  # fmt: skip
    data = prepare_data(config, probed, out / "data")
    rows, measured, shared = [], [], {}
    probes: dict[tuple, tuple[Cell, dict[str, Any]]] = {}
    start = time.perf_counter()
    for index, (cell, key) in enumerate(zip(probed, keys, strict=True)):
        calibrations = calibrate(config, cell)
        if key in probes:
            first, first_measures = probes[key]
            measures = first_measures | {"measured_by": first.name, "wall_seconds": 0.0}
        else:
            work = out / "logs" / f"{index:03d}"
            measures = probe_cell(config, cell, device, data, work, steps, timeout, shared)
            write_cell(work / CELL_FILE, config, cell, measures)
            probes[key] = (cell, measures)
        cell_rows_ = cell_rows(config, cell, calibrations, measures)
        rows += cell_rows_
        measured.append((cell, measures))
        status = "ok" if all(r["status"] == "ok" for r in cell_rows_) else "ERROR"
        elapsed = time.perf_counter() - start
        eta = elapsed / len(probes) * len(set(keys[index + 1 :]) - probes.keys())
        how = (f"probe of {measures['measured_by']}" if "measured_by" in measures
               else f"{measures['wall_seconds']:.0f} s")  # fmt: skip
        print(f"[{index + 1}/{len(probed)}] {cell.name}: {status} "
              f"{measures.get('seconds_per_step', math.nan):.3g} s/step, "
              f"peak {measures.get('peak_rss_mb', math.nan):.0f} MB, {how}; "
              f"elapsed {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min", flush=True)  # fmt: skip
    frame = pd.DataFrame(rows)
    write_table(labelled(frame), out / "preflight.csv")
    costs = cost_frame(config, projected(cells, probed, measured))
    write_table(labelled(costs), out / "cost.csv")
    plot_cost(costs, out / "cost.png")
    failed = frame[frame["status"] != "ok"]
    for _, row in failed.iterrows():
        print(f"FAILED {row['cell']} {row['rule']} eps={row['eps']:g}: {row['message']}")
    return failed


def projected(
    cells: Sequence[Cell], probed: Sequence[Cell], measured: Sequence[tuple[Cell, Any]]
) -> list[tuple[Cell, Any]]:  # fmt: skip
    """Every cell of the grid in order with the measures its cost is projected from: its own
    probe's, or for a cell a sample skipped its `nearest` probed cell's (`measured_by`)."""
    own = {id(cell): m for cell, m in measured}
    out = []
    for cell in cells:
        proxy = cell if id(cell) in own else nearest(cell, probed)
        if proxy is cell:
            out.append((cell, own[id(cell)]))
        elif proxy is not None:
            out.append((cell, own[id(proxy)] | {"measured_by": proxy.name}))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Probe the grid the config files give, write the tables and the figure; 1 when any
    cell failed."""
    from dpmed.config.checks import check_config, load_configs
    from dpmed.install import workflow_file

    args = parse_args(argv)
    config = load_configs(args.config)
    grid = check_config(config, workflow_file("config/schema.yaml"))
    failed = run_preflight(config, grid, args.out, sample=args.sample, studies=args.studies,
                           steps=args.steps, timeout=args.timeout)  # fmt: skip
    return 1 if len(failed) else 0
