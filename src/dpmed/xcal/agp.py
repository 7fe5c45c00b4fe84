"""AGP baseline (Adaptive Gradient Protection, Li et al. TMC 2024), on XCal's clipped gradients.

Less noise on the channels that matter: for every parameter tensor, the output channels (dim 0)
of the global model received this round are ranked by the L2 norm of their weights; the top
`top_q` share (at least one) gets noise multiplier σ_ref, the others (1 + b)·σ_ref. Importance
comes from the broadcast global model only (already a DP release), so it costs no privacy.
Adding more noise to some coordinates is post-processing of the mechanism with σ_ref on all of
them, so the guarantee is that of the smallest σ: σ_ref, calibrated to the target ε.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


def channel_noise_std(
    global_state: Mapping[str, torch.Tensor],
    params: Mapping[str, torch.Tensor],
    sigma_ref: float,
    band: float,
    top_q: float,
    clip_norm: float,
) -> dict[str, torch.Tensor]:
    """Noise std per output channel, (C0,) per parameter name: σ·C with σ ∈ {σ_ref, (1+b)σ_ref}."""
    out = {}
    for name, p in params.items():
        weights = global_state[name].to(p.device, torch.float32)
        importance = weights.reshape(weights.shape[0], -1).norm(dim=1)
        k = max(1, math.ceil(top_q * importance.numel()))
        top = torch.topk(importance, k, sorted=False).indices
        sigma = torch.full_like(importance, (1 + band) * sigma_ref)
        sigma[top] = sigma_ref
        out[name] = sigma * clip_norm
    return out
