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
from dpmed.studies import STUDIES


def check_config(config: MutableMapping[str, Any], schema: str | Path) -> Grid:
    """Validate `config` in place (schema defaults filled, every mapping's keys sorted) and
    return its expanded `Grid`."""
    from snakemake.utils import validate  # heavy import, only where a config is checked

    validate(config, str(schema))
    sort_keys_in_place(config)
    grid = Grid(config)
    for dataset in grid.datasets():
        _check_dataset(config["data"], dataset)
    for name, spec in STUDIES.items():
        spec.check(config[name], grid.jobs(name))
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
