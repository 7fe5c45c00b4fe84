"""XCal-FL's explainability signal and its map to the noise multiplier (paper 001 §4).

Per sample i of a mini-batch, with the current model, label y_i and Grad-CAM map for y_i
(upsampled to the input size), the top-q most salient pixels M_i are replaced by the image's
per-channel mean (the masked forward pass). With z, z̃ the logits of the clean and the masked
image, p = softmax(z), p̃ = softmax(z̃) and m(p) = p_y − max_{j≠y} p_j the class margin:
- logit change    a_i = clip(z_y − z̃_y, 0, 1)  (causal influence of the salient region on the
                  label's logit, as the paper's "prediction logit variations" (§4.1, weight α);
                  a rise counts 0 and a drop of one logit unit or more counts 1, the scale of
                  the other two components),
- counterfactual  b_i = (1 − m(p̃)) / 2 ∈ [0, 1] (1 = the masked image crosses the decision
                  boundary to another class with full confidence, 0 = still surely y),
- concentration   g_i = clip((Σ_{M_i} cam / Σ cam − q) / (1 − q), 0, 1) (0 = attention spread
                  uniformly, 1 = all of it inside the top-q region; an all-zero map gives 0).
s_i = clip((α a_i + β b_i + γ g_i) / (α + β + γ), 0, 1). Privatisation (Gaussian on the batch
sum, sensitivity 1 under add/remove of one sample) and the EMA are XCal-FL's step
(`dpmed.xcal.methods.XCalFL`); `sigma_from_signal` maps the smoothed signal s̄ to
σ_t = σ_ref (1 + b (1 − 2 s̄)) ∈ [(1−b)σ_ref, (1+b)σ_ref]: faithful, concentrated explanations
get less noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dpmed.explain.gradcam import grad_cam, quiet, upsample


def top_q_mask(cam: torch.Tensor, q: float) -> torch.Tensor:
    """(B, H, W) bool: the ceil(q·H·W) largest values of each map (ties by position)."""
    flat = cam.flatten(1)
    k = max(1, int(-(-q * flat.shape[1] // 1)))
    idx = torch.topk(flat, k, dim=1, sorted=False).indices
    mask = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, idx, True)
    return mask.reshape(cam.shape)


def components(
    module: nn.Module, layer: str, x: torch.Tensor, y: torch.Tensor, q: float
) -> dict[str, torch.Tensor]:
    """The three per-sample components (B,) each in [0, 1]: logit_drop, margin, concentration."""
    cam, logits = grad_cam(module, layer, x, y)
    cam = upsample(cam, x.shape[-1])
    mask = top_q_mask(cam, q)
    fill, m = x.mean(dim=(2, 3), keepdim=True), mask[:, None].to(x.dtype)  # per-image channel mean
    with quiet(module) as net, torch.no_grad():
        masked_logits = net(x * (1 - m) + fill * m)
    drop = (logits.gather(1, y[:, None]) - masked_logits.gather(1, y[:, None]))[:, 0].clamp(0, 1)
    probs = masked_logits.softmax(dim=1)
    own = probs.gather(1, y[:, None])[:, 0]
    others = probs.scatter(1, y[:, None], -1.0).amax(dim=1)  # the largest other class
    margin = ((1 - (own - others)) / 2).clamp(0, 1)
    total = cam.flatten(1).sum(dim=1)
    inside = (cam * mask).flatten(1).sum(dim=1)
    share = torch.where(total > 0, inside / total.clamp(min=1e-12), torch.zeros_like(total))
    concentration = ((share - q) / (1 - q)).clamp(0, 1)
    return {"logit_drop": drop, "margin": margin, "concentration": concentration}


def combine(parts: dict[str, torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """s_i = clip(weighted mean of the components with weights (α, β, γ), 0, 1)."""
    alpha, beta, gamma = (float(w) for w in weights)
    total = alpha + beta + gamma
    if total <= 0:
        raise ValueError(f"signal weights {tuple(weights)} must have a positive sum")
    s = alpha * parts["logit_drop"] + beta * parts["margin"] + gamma * parts["concentration"]
    return (s / total).clamp(0, 1)


def sigma_from_signal(smoothed: float, reference_sigma: float, band: float) -> float:
    """σ_t = σ_ref (1 + b (1 − 2 s̄)), s̄ clipped to [0, 1]."""
    s = min(1.0, max(0.0, smoothed))
    return reference_sigma * (1 + band * (1 - 2 * s))
