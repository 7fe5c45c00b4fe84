"""The toy study's sizing: one pass over the training images."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpmed.data.registry import DATASET_REGISTRY
from dpmed.sizing import RuleSizing, StudySizing, Work


def _images(data: Mapping[str, Any], wc: Mapping[str, str]) -> tuple[int, int]:
    """(training images, values per image)."""
    n = DATASET_REGISTRY[wc["dataset"]].images(data[wc["dataset"]])[1]
    return n, data[wc["dataset"]]["size"] ** 2


def memory(data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]) -> dict:
    n, d = _images(data, wc)
    return {"const": 1.0, "host": 2 * n * d * 8 / 1e6, "device": 0.0}


def work(data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]) -> dict:
    n, d = _images(data, wc)
    return {"image": Work(n, d / 1e9, "work", "seconds_per_image")}


SIZING = StudySizing(
    rules={"toy_train": RuleSizing(memory, work, "image")},
    shape_key=lambda wc, params: (wc["dataset"],),
    probe_key=lambda key: key,
    cost_features=lambda key, params: key,
    sample_features=lambda key, wc: [f"dataset={wc['dataset']}"],
)
