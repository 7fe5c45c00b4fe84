"""How many images one forward pass of a seg network holds: read by the runner, the membership
attack and the job sizing (torch-free, so the sizing can read it when the workflow is parsed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def forward_batch_size(params: Mapping[str, Any]) -> int:
    """Images per evaluation forward pass: `batch_size`, or `physical_batch` where smaller.

    A memory bound like training's chunks: without DP-Morph, and with fixed or per-image
    DP-Morph, an image's output does not depend on the others in its pass (batch-adaptive
    DP-Morph cannot run with `physical_batch`: `dpmed.seg.run.Plan`).
    """
    batch, physical = int(params["batch_size"]), params.get("physical_batch")
    return batch if physical is None else min(batch, int(physical))
