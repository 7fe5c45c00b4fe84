"""The job file the xcal ServerApp reads (its run config names it): one xcal job as JSON.

It holds what a `JobContext` holds (processed data folder, run folder, wildcards,
hyperparameters, job seed, device, threads), so the deployed server runs the same job the
in-process runner would run from the same context.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpmed.io import write_json
from dpmed.runtime import JobContext


def write_job(path: Path, job: JobContext) -> None:
    """Write `job` to `path` (JSON)."""
    write_json(
        path,
        {
            "processed_dir": str(Path(job.processed_dir).resolve()),
            "out_dir": str(Path(job.out_dir).resolve()),
            "wildcards": dict(job.wildcards),
            "params": dict(job.params),
            "seed": int(job.seed),
            "device": job.device,
            "threads": job.threads,
        },
    )


def read_job(path: Path) -> JobContext:
    """The JobContext `write_job` wrote to `path`."""
    spec = json.loads(Path(path).read_text())
    return JobContext(
        processed_dir=Path(spec["processed_dir"]),
        out_dir=Path(spec["out_dir"]),
        wildcards=spec["wildcards"],
        params=spec["params"],
        seed=int(spec["seed"]),
        device=spec["device"],
        threads=spec["threads"],
    )
