"""Rebuild a trained seg network from its run folder (model.pt + the job's hyperparameters),
for the analyses that read finished runs (membership attack, visual figures)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpmed.models import build_model
from dpmed.runtime import select_device


def load_run_model(run_dir: str | Path, hp: Mapping[str, Any], device: str = "cpu") -> nn.Module:
    """The network saved in `run_dir/model.pt`, built with the job's width/depth/deep
    supervision from `hp`, on `device` (`auto`, `cpu`, `cuda`…) and in eval mode."""
    path = Path(run_dir) / "model.pt"
    saved = torch.load(path, map_location="cpu", weights_only=True)
    net = build_model(
        saved["model"],
        in_channels=1,
        n_classes=int(saved["n_classes"]),
        width=int(hp["width"]),
        depth=int(hp["depth"]),
        deep_supervision=bool(hp["deep_supervision"]),
    )
    try:
        net.load_state_dict(saved["state_dict"])
    except RuntimeError as err:
        raise ValueError(f"{path}: weights do not fit the configured architecture: {err}") from err
    return net.to(select_device(device)).eval()
