"""How often Snakemake samples a running job for its benchmark file (config
`logging.benchmark_interval`).

Snakemake (pinned 9.27.1) measures a job whose rule has a `benchmark:` file by sampling the
job's process tree: at its start, then every `BENCHMARK_INTERVAL_SHORT` (0.5 s) for 30
samples, then every 30 s. Each sample reads /proc/<pid>/smaps_rollup (psutil's
`memory_full_info`), which walks the job's page tables under its memory-map lock: kernel time
in the Snakemake process per sample, and stalls in the job itself while it allocates. That is
nothing beside a cluster job of hours, but much of a demo job of seconds. A longer interval
samples a short job's memory fewer times, so its benchmark's `max_rss` can miss a short peak.
"""

from __future__ import annotations

import math

import snakemake.benchmark


def set_benchmark_interval(seconds: float) -> None:
    """Sample benchmarked jobs every `seconds` (> 0) during their first 30 samples. Raises if
    this Snakemake has no such setting, so an upgrade that renames it fails here rather than
    silently sampling at its own rate."""
    if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"logging.benchmark_interval must be a positive number, got {seconds!r}")
    if not hasattr(snakemake.benchmark, "BENCHMARK_INTERVAL_SHORT"):
        raise RuntimeError(
            "snakemake.benchmark.BENCHMARK_INTERVAL_SHORT is gone in this Snakemake; "
            "logging.benchmark_interval cannot be applied"
        )
    snakemake.benchmark.BENCHMARK_INTERVAL_SHORT = float(seconds)
