"""A preflight's cost: the projection of a job from its cell's measures, the cost table and
figure, and the measures as points of the job cost model.

The projection is the runtime model `dpmed.job_cost` fits (`dpmed.sizing`), Σ count × seconds
of one unit over the job's units of work, with the seconds the probe of its cell measured at
the configured sizes instead of fitted ones. The counts are the job's own (its params and the
configured data sizes); each study's `<study>/sizing.py` says what its rules' units are and
which measure times each.

Hours are on the device the probes ran on. A CPU→GPU factor needs the same cell measured on
both, so GPU hours of a CPU-only preflight are written as unknown, never estimated.

`bench/job_cost.py --preflight DIR` adds the points of `cost_points`, measured at the
configured sizes, to the measured jobs the cost model is fitted on, so that the paper grid's
requests rest on measures at the paper's sizes: the probe's peak RSS, and as time the
projection of the whole job (a lower bound, which the request's time margin covers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dpmed.job_cost import MODEL as JOB_COST
from dpmed.job_cost import REQUEST_LABELS, features, rule_sizing
from dpmed.preflight.study import CELL_FILE, Cell, rule_jobs, study_rules

NO_GPU = "unknown (no GPU measured)"
TOTAL = "total"
# The written tables' headers of the columns that hold a model's prediction, not a measurement:
# each says "predicted" and names its model, the job-cost model (`dpmed.job_cost`, fitted
# coefficients on CPU) or the preflight's projection (this probe's seconds per step × the
# job's steps, `measured_seconds`). Measured columns (`peak_rss_mb`, `s_per_step`) keep
# their names; the job-cost model's peak sits beside the measured one.
PROJECTION = "preflight: measured s/step × steps"
LABELS = REQUEST_LABELS | {
    "predicted_peak_mb": f"predicted_peak_mb ({JOB_COST}, CPU)",
    "projected_min": f"predicted_min ({PROJECTION})",
    "job_cost_min": f"predicted_min ({JOB_COST}, CPU)",
    "hours_per_job": f"predicted_hours_per_job ({PROJECTION})",
    "cpu_hours": f"predicted_cpu_hours ({PROJECTION})",
    "gpu_hours": f"predicted_gpu_hours ({PROJECTION})",
}


def measured_seconds(
    rule: str, data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any],
    measures: Mapping[str, float],
) -> tuple[float, float]:  # fmt: skip
    """(steps, seconds) of one job of `rule` on the device the probe ran on: the count of its
    rule's step unit, and Σ count × measured seconds of one unit (`Work.measure`, divided by
    `Work.per` where the probe timed several units at once)."""
    sizing = rule_sizing(rule)
    units = sizing.work(data, wc, hp)
    seconds = sum(
        unit.count * measures[unit.measure] / (measures[unit.per] if unit.per else 1.0)
        for unit in units.values()
    )
    return units[sizing.step].count, seconds


def step_measure(
    rule: str, data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> str:
    """The measure giving the seconds of one step of `rule` (its sizing's step unit)."""
    sizing = rule_sizing(rule)
    return sizing.work(data, wc, hp)[sizing.step].measure


def labelled(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (preflight rows or `cost_frame`) with the written headers (`LABELS`)."""
    return frame.rename(columns=LABELS)


def cost_frame(
    config: Mapping[str, Any], measured: Sequence[tuple[Cell, Mapping[str, Any]]]
) -> pd.DataFrame:
    """One row per (cell, rule): its jobs, mean steps and hours per job, total hours, and
    `measured_by`, the cell whose probe gave the seconds (itself, or for a cell the sample did
    not probe the nearest probed one: its measures carry `measured_by`); then one total row
    per (study, rule). Cells whose probe failed are left out of the totals and listed with
    status error."""
    rows, rules, data = [], study_rules(), config["data"]
    for cell, m in measured:
        for rule in rules[cell.study]:
            jobs = rule_jobs(cell, rule)
            if not jobs:
                continue
            row = {"study": cell.study, "rule": rule, "cell": cell.name, "jobs": len(jobs),
                   "measured_by": m.get("measured_by", cell.name), "device": m.get("device", ""),
                   "status": m.get("status", "error")}  # fmt: skip
            if m.get("status") == "ok":
                costs = [measured_seconds(rule, data, j.wc, j.params, m) for j in jobs]
                hours = sum(seconds for _, seconds in costs) / 3600
                row |= {"steps_per_job": sum(s for s, _ in costs) / len(costs),
                        "s_per_step": m[step_measure(rule, data, jobs[0].wc, jobs[0].params)],
                        "hours_per_job": hours / len(costs), "hours": hours}  # fmt: skip
            rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    if "hours" not in frame:  # no probe succeeded
        frame["hours"] = float("nan")
    ok = frame[frame["status"] == "ok"]
    totals = [{"study": study, "rule": rule, "cell": TOTAL, "jobs": int(group["jobs"].sum()),
               "device": ",".join(sorted(set(group["device"]))), "status": "ok",
               "hours": group["hours"].sum()}
              for (study, rule), group in ok.groupby(["study", "rule"], sort=False)]  # fmt: skip
    frame = pd.concat([frame, pd.DataFrame(totals)], ignore_index=True)
    gpu = frame["device"] == "cuda"
    frame["gpu_hours"] = frame["hours"].where(gpu).astype(object)
    frame.loc[~gpu, "gpu_hours"] = NO_GPU
    frame["cpu_hours"] = frame["hours"].where(~gpu)
    return frame.drop(columns="hours")


def plot_cost(frame: pd.DataFrame, png_path: str | Path) -> None:
    """Bar chart of the predicted total hours per study and rule (log scale), png and pdf."""
    import matplotlib.pyplot as plt

    from dpmed.report.style import save_figure

    fig, ax = plt.subplots(figsize=(6, 2.8))
    totals = frame[frame["cell"] == TOTAL] if not frame.empty else frame
    if totals.empty:
        ax.text(0.5, 0.5, "no cell measured", ha="center", va="center")
    else:
        labels = [f"{s} / {r}" for s, r in zip(totals["study"], totals["rule"], strict=True)]
        hours = totals["cpu_hours"].fillna(0) + pd.to_numeric(
            totals["gpu_hours"], errors="coerce"
        ).fillna(0)
        ax.barh(labels, hours, color="#4c72b0")
        ax.set_xscale("log")
        for y, h in enumerate(hours):
            ax.text(h, y, f" {h:,.0f} h" if h >= 100 else f" {h:.3g} h", va="center", fontsize=8)
        device = ", ".join(sorted(set(totals["device"])))
        ax.set_xlabel(f"predicted job hours on the probing device ({device})")
    ax.set_title(f"Predicted cost of the grid ({PROJECTION} per job)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, png_path)


def cost_points(folder: Path) -> list[dict[str, Any]]:
    """One point per cell the preflight in `folder` probed without error: the training rule of
    the cell's study, its cost features at the probed sizes, the probe's peak RSS as
    `measured.mem` and the projected seconds of the representative job as `measured.time`
    (`source` preflight), with the job's params and the data sections its wildcards name (the
    study's and its dataset's), so a refit can recompute its features."""
    out = []
    for path in sorted(Path(folder).glob(f"logs/*/{CELL_FILE}")):
        cell = json.loads(path.read_text())
        measures = cell["measures"]
        if measures.get("status") != "ok":
            continue
        rule, wc, params = f"{cell['study']}_train", cell["wildcards"], cell["params"]
        data = {name: section for name, section in cell["data"].items()
                if name == cell["study"] or name in wc.values()}  # fmt: skip
        mem, time = features(rule, {"data": data}, wc, params)
        _, seconds = measured_seconds(rule, data, wc, params, measures)
        measured = {"mem": measures["peak_rss_mb"], "time": seconds}
        out.append({"rule": rule, "source": "preflight", "wildcards": wc, "params": params,
                    "data": data, "mem": mem, "time": time, "measured": measured})  # fmt: skip
    return out
