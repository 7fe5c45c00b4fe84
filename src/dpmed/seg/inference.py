"""Rebuild a trained seg network from its run folder, for the analyses that read finished runs
(membership attack, visual figures): model.pt carries the build arguments."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from dpmed.models import load_model
from dpmed.runtime import select_device


def load_run_model(run_dir: str | Path, device: str = "cpu") -> nn.Module:
    """The network saved in `run_dir/model.pt`, on `device` (`auto`, `cpu`, `cuda`…) and in
    eval mode."""
    return load_model(Path(run_dir) / "model.pt", select_device(device))
