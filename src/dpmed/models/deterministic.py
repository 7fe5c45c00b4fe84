"""Stand-ins for the model ops whose CUDA backward PyTorch has only in a nondeterministic form
(it raises under `torch.use_deterministic_algorithms(True)`, which every job sets): the global
average pool `nn.AdaptiveAvgPool2d(1)` and the bilinear resize `F.interpolate(...,
mode="bilinear", align_corners=False)`. Each computes the same function with ops whose CUDA
backward is deterministic (a mean; matrix products). docs/reproducibility.md lists them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GlobalAvgPool2d(nn.Module):
    """(B, C, H, W) → (B, C, 1, 1), the mean over H and W: `nn.AdaptiveAvgPool2d(1)`, with a
    broadcast as its backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(-2, -1), keepdim=True)


def replace_global_pools(module: nn.Module) -> None:
    """Swap every `nn.AdaptiveAvgPool2d` with output size 1 inside `module` (in place) for a
    `GlobalAvgPool2d` (for networks built by a library, e.g. MONAI's EfficientNet)."""
    for parent in module.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.AdaptiveAvgPool2d) and child.output_size in (1, (1, 1)):
                setattr(parent, name, GlobalAvgPool2d())


def interpolation_matrix(
    n_in: int, n_out: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> torch.Tensor:
    """(n_out, n_in) weights of PyTorch's linear interpolation with align_corners=False: output
    i reads the source coordinate s = max(0, (i + ½)·n_in/n_out − ½), weight 1 − λ at ⌊s⌋ and
    λ = s − ⌊s⌋ at min(⌊s⌋ + 1, n_in − 1)."""
    source = ((torch.arange(n_out, dtype=torch.float64) + 0.5) * (n_in / n_out) - 0.5).clamp(min=0)
    low = source.floor().long().clamp(max=n_in - 1)
    high = (low + 1).clamp(max=n_in - 1)
    lam = source - low
    matrix = torch.zeros(n_out, n_in, dtype=torch.float64)
    rows = torch.arange(n_out)
    matrix.index_put_((rows, low), 1 - lam, accumulate=True)
    matrix.index_put_((rows, high), lam, accumulate=True)
    return matrix.to(dtype=dtype, device=device)


def separable_bilinear(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of (..., H, W) to (..., h, w) as A_h · x · A_wᵀ (`interpolation_matrix`):
    equal to `F.interpolate(x, size, mode="bilinear", align_corners=False)` up to rounding."""
    rows = interpolation_matrix(x.shape[-2], size[0], x.dtype, x.device)
    cols = interpolation_matrix(x.shape[-1], size[1], x.dtype, x.device)
    return rows @ x @ cols.T


def bilinear_resize(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """`F.interpolate(x, size, mode="bilinear", align_corners=False)` of (B, C, H, W): on CUDA
    the separable matrix form (deterministic backward), elsewhere PyTorch's kernel (already
    deterministic on the CPU)."""
    size = (int(size[0]), int(size[1]))
    if x.is_cuda:
        return separable_bilinear(x, size)
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
