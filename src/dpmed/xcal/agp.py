"""AGP baselines (Adaptive Gradient Protection, Li et al., IEEE TMC 2024) on XCal's clipped
gradients: where the DP-SGD noise goes, output channel (dim 0) by output channel.

Paper 001 (XCal-FL) describes AGP in its related work as "fixed-magnitude spatial noise
allocation": the noise has one magnitude, fixed before training, and AGP only decides where it
goes (XCal-FL instead moves the magnitude itself); AGP's own abstract adds noise only to the
channels with a small impact on interpretability. Our reading, `agp`:
every tensor's output channels are ranked by the L2 norm of their weights in the broadcast
global model; the top `top_q` share (at least one) is protected and gets no noise, every other
channel gets σ_ref·C, σ_ref being the static baseline's multiplier for the target ε. Paper 001
names neither the ranking nor the share: both are ours (the global model is already a DP
release, so ranking it costs nothing). The protected channels are released without noise, so
no finite ε covers the update: privacy.json labels the run `paper-approximation` and reports
the ε of the noised channels, σ_ref per step (docs/privacy.md, finding 10).

`agp-dp` is the sound variant: σ_ref on the protected channels and
(1 + b)·σ_ref on the others. More noise on some coordinates is post-processing of the mechanism
with σ_ref on all of them, so its guarantee is that of σ_ref, calibrated to the target ε.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


def channel_std(
    global_state: Mapping[str, torch.Tensor],
    params: Mapping[str, torch.Tensor],
    top_q: float,
    protected_std: float,
    other_std: float,
) -> dict[str, torch.Tensor]:
    """Noise std per output channel, (C0,) per parameter name: `protected_std` on the
    protected channels of the broadcast global model (the top `top_q` share, at least one, by
    the L2 norm of their weights), `other_std` on the others (`agp`: 0 and σ_ref·C; `agp-dp`:
    σ_ref·C and (1 + b)·σ_ref·C)."""
    out = {}
    for name, p in params.items():
        weights = global_state[name].to(p.device)
        importance = weights.reshape(weights.shape[0], -1).to(torch.float32).norm(dim=1)
        k = max(1, math.ceil(top_q * importance.numel()))
        protected = torch.zeros_like(importance, dtype=torch.bool)
        protected[torch.topk(importance, k, sorted=False).indices] = True
        out[name] = torch.where(protected, protected_std, other_std).to(torch.float32)
    return out
