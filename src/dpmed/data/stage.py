"""The data stage as the workflow calls it: generate synthetic raw data, then preprocess raw
data (synthetic or real, same loaders) into the processed format of its family."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpmed.data.registry import family_module, generator_module
from dpmed.io import atomic_dir, remove_stale_temporaries
from dpmed.seeding import stable_seed


def synthesize(dataset: str, cfg: Mapping[str, Any], raw_dir: str | Path) -> None:
    """Write synthetic data for `dataset` in its public raw format into `raw_dir`."""
    seed = stable_seed("synthetic", dataset, cfg["synthetic"].get("seed", 0))
    start = time.perf_counter()
    _remove_stale(raw_dir)
    generator_module(dataset).generate(Path(raw_dir), dataset, dict(cfg), seed)
    print(
        f"[synthesize] {dataset}: wrote {raw_dir} in {time.perf_counter() - start:.1f} s "
        f"(seed {seed})",
        flush=True,
    )


def preprocess(
    dataset: str, cfg: Mapping[str, Any], raw_dir: str | Path, out_dir: str | Path
) -> None:
    """Read `raw_dir` with the family loader (validating it) and write `out_dir`.

    The family writes into a temporary sibling folder that replaces `out_dir` only once it has
    finished, so a bad raw file found halfway leaves no partial processed files: `out_dir` stays
    as it was (absent, or the previous complete result); on success it holds only this run's files.
    Temporary folders that a killed run left next to `out_dir` are removed first.
    """
    start = time.perf_counter()
    _remove_stale(out_dir)
    with atomic_dir(out_dir) as tmp:
        family_module(dataset).preprocess(Path(raw_dir), tmp, dataset, dict(cfg))
    print(
        f"[preprocess] {dataset}: {raw_dir} -> {out_dir} in {time.perf_counter() - start:.1f} s",
        flush=True,
    )


def synthetic_processed(dataset: str, cfg: Mapping[str, Any], root: str | Path) -> Path:
    """The config's synthetic `dataset` (`cfg`: its `data.<dataset>` block) generated into
    root/raw and processed into root/processed, as the workflow's data stage makes them: what
    a command run outside the workflow (the FL launchers) trains on. Returns root/processed."""
    if cfg.get("raw") != "synthetic":
        raise SystemExit(f"data.{dataset}.raw is not synthetic in the config: give --processed")
    raw, processed = Path(root) / "raw", Path(root) / "processed"
    synthesize(dataset, cfg, raw)
    preprocess(dataset, cfg, raw, processed)
    return processed


def _remove_stale(folder: str | Path) -> None:
    """Remove the temporary folders a killed run writing `folder` left. Safe here: `folder` is
    the output of the job calling this, and Snakemake runs one job per output at a time."""
    for tmp in remove_stale_temporaries(folder):
        print(f"[stage] removed {tmp}, left by a run that was killed", flush=True)
