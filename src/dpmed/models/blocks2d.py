"""Opacus-valid 2D building blocks shared by the segmentation models.

GroupNorm instead of BatchNorm (per-sample gradients need no cross-sample statistics), no
in-place activations, every module used once per forward (Opacus hooks would fire twice on a
shared module).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dpmed.models.deterministic import bilinear_resize


def groups_for(channels: int) -> int:
    """GroupNorm groups: the largest of 8, 4, 2, 1 that divides `channels`."""
    return math.gcd(channels, 8)


class ConvNormAct(nn.Module):
    """3×3 (or k×k) convolution → GroupNorm → ReLU; `dilation` keeps the spatial size."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, dilation: int = 1) -> None:
        super().__init__()
        pad = dilation * (kernel // 2)
        self.conv = nn.Conv2d(cin, cout, kernel, padding=pad, dilation=dilation, bias=False)
        self.norm = nn.GroupNorm(groups_for(cout), cout)
        self.act = nn.ReLU(inplace=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


class DoubleConv(nn.Module):
    """Two ConvNormAct layers, the U-Net stage."""

    def __init__(self, cin: int, cout: int, dilation: int = 1) -> None:
        super().__init__()
        self.first = ConvNormAct(cin, cout, dilation=dilation)
        self.second = ConvNormAct(cout, cout, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def resize_to(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Bilinear resize of `x` to the spatial size of `ref` (identity when equal; CUDA-
    deterministic, `dpmed.models.deterministic.bilinear_resize`)."""
    if x.shape[-2:] == ref.shape[-2:]:
        return x
    return bilinear_resize(x, ref.shape[-2:])


def pool_to(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Max-pool `x` down to the spatial size of `ref` (x's size is a power-of-two multiple)."""
    factor = x.shape[-1] // ref.shape[-1]
    return F.max_pool2d(x, factor) if factor > 1 else x


def stage_widths(width: int, depth: int) -> list[int]:
    """Channels per resolution level 0..depth: width · 2^level."""
    if width < 1 or depth < 1:
        raise ValueError(f"width and depth must be ≥ 1, got width={width}, depth={depth}")
    return [width * 2**level for level in range(depth + 1)]
