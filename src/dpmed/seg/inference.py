"""Rebuild a trained seg network from its run folder (model.pt + the job's hyperparameters),
for the analyses that read finished runs (membership attack, visual figures)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from dpmed.models import load_model
from dpmed.runtime import select_device


def load_run_model(run_dir: str | Path, hp: Mapping[str, Any], device: str = "cpu") -> nn.Module:
    """The network saved in `run_dir/model.pt`, built with the job's width/depth/deep
    supervision from `hp`, on `device` (`auto`, `cpu`, `cuda`…) and in eval mode."""
    return load_model(Path(run_dir) / "model.pt", select_device(device))
