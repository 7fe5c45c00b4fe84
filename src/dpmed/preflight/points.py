"""A preflight's measures as points of the job cost model (`dpmed.job_cost`).

`bench/job_cost.py --preflight DIR` adds these points, measured at the configured sizes, to
the measured jobs the cost model is fitted on, so that the paper grid's requests rest on
measures at the paper's sizes: the probe's peak RSS, and as time the preflight's projection of
the whole job (its counts of work × the measured seconds of one unit, `dpmed.preflight.cost`;
a lower bound, which the request's time margin covers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpmed import job_cost
from dpmed.preflight.cells import CELL_FILE
from dpmed.preflight.cost import measured_seconds


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
        mem, time = job_cost.features(rule, {"data": data}, wc, params)
        _, seconds = measured_seconds(rule, data, wc, params, measures)
        measured = {"mem": measures["peak_rss_mb"], "time": seconds}
        out.append({"rule": rule, "source": "preflight", "wildcards": wc, "params": params,
                    "data": data, "mem": mem, "time": time, "measured": measured})  # fmt: skip
    return out
