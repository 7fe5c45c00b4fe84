"""Validate a config: JSON schema (Snakemake's `validate`, which also fills defaults), then the
rules a schema cannot express. Every failure names the config key and what is wrong."""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from dpmed.config.grid import Grid
from dpmed.data.registry import DATASET_REGISTRY
from dpmed.errors import ConfigError


def check_config(config: MutableMapping[str, Any], schema: str | Path) -> Grid:
    """Validate `config` in place (schema defaults filled, every mapping's keys sorted) and
    return its expanded `Grid`."""
    from snakemake.utils import validate  # heavy import, only where a config is checked

    validate(config, str(schema))
    sort_keys_in_place(config)
    grid = Grid(config)
    for dataset in grid.datasets():
        _check_dataset(config["data"], dataset)
    _check_seg(config["seg"])
    _check_xcal(config["xcal"], grid)
    return grid


def sort_keys_in_place(node: Any) -> None:
    """Sort the keys of every mapping below `node`. Snakemake compares a job's params with the
    recorded ones by their repr, so without this a config that only lists keys in another
    order (e.g. written by yaml.safe_dump) would rerun every job."""
    if isinstance(node, MutableMapping):
        items = sorted(node.items())
        node.clear()
        node.update(items)
        for value in node.values():
            sort_keys_in_place(value)
    elif isinstance(node, list):
        for value in node:
            sort_keys_in_place(value)


def _check_dataset(data: Mapping[str, Any], dataset: str) -> None:
    key = f"data.{dataset}"
    if dataset not in data:
        raise ConfigError(key, "the dataset is used by a study grid but has no data entry")
    cfg = data[dataset]
    if cfg["raw"] == "synthetic":
        missing = [k for k in DATASET_REGISTRY[dataset].synthetic_keys if k not in cfg["synthetic"]]
        if missing:
            raise ConfigError(f"{key}.synthetic", f"missing {', '.join(missing)}")
    elif not Path(cfg["raw"]).exists():
        raise ConfigError(f"{key}.raw", f"folder '{cfg['raw']}' does not exist")
    if "split" in cfg and not math.isclose(sum(cfg["split"]), 1.0, abs_tol=1e-6):
        raise ConfigError(f"{key}.split", f"fractions {cfg['split']} must sum to 1")
    synthetic = cfg.get("synthetic", {})
    if synthetic.get("n_annotated", 0) > synthetic.get("n_bscans", math.inf):
        raise ConfigError(f"{key}.synthetic.n_annotated", "exceeds n_bscans")


def _check_seg(seg: Mapping[str, Any]) -> None:
    for where, params in _param_sets(seg):
        if "quantiles" in params:
            low, high = params["quantiles"]
            if not low < high:
                raise ConfigError(
                    f"seg.{where}.quantiles", f"need q_low < q_high, got {low}, {high}"
                )


def _check_xcal(xcal: Mapping[str, Any], grid: Grid) -> None:
    for where, params in _param_sets(xcal):
        if "brightness" in params:
            low, high = params["brightness"]
            if not low <= high:
                raise ConfigError(
                    f"xcal.{where}.brightness", f"need low <= high, got {low}, {high}"
                )
    for job in grid.jobs("xcal"):
        method = job.wc["method"]
        if not method.startswith("xcal"):
            continue
        preset = method.partition("-")[2] or "balanced"
        presets = job.params["presets"]
        if preset not in presets:
            raise ConfigError(
                f"{job.block}.methods",
                f"'{method}' needs xcal presets.{preset} (have: {', '.join(sorted(presets))})",
            )


def _param_sets(section: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The defaults and every block's params override, with their key paths."""
    sets = [("defaults", section["defaults"])]
    sets += [
        (f"grid[{i}].params", block["params"])
        for i, block in enumerate(section["grid"])
        if "params" in block
    ]
    return sets
