"""One DP-SGD step for the xcal classifiers, on Opacus' per-sample gradients.

The model is wrapped in Opacus' `GradSampleModule` (hooks, or functorch when `mode` is
"functorch"); a step on a Poisson-sampled batch (possibly empty) computes the per-sample
cross-entropy gradients g_i, clips them flat to ‖g_i‖₂ ≤ C (factor min(1, C/‖g_i‖), norm over all
parameters), sums them, adds Gaussian noise and divides by the EXPECTED batch size q·N (Opacus'
convention for Poisson sampling):  g = (Σ_i clip(g_i) + N(0, (σ C)² I)) / (q N).
The noise std may differ per output channel (AGP): then `noise_std[name]` is a tensor
broadcast along dim 0 of the parameter; the guarantee is that of the smallest σ (the extra
noise on other channels is post-processing of the smallest-σ mechanism).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from torch import nn


def wrap(model: nn.Module, mode: str) -> GradSampleModule:
    """Per-sample-gradient wrapper: `mode` "hooks" (Opacus layer hooks) or "functorch"."""
    if mode not in ("hooks", "functorch"):
        raise ValueError(f"grad-sample mode must be hooks or functorch, got {mode!r}")
    return GradSampleModule(model, loss_reduction="sum", force_functorch=mode == "functorch")


def trainable(module: nn.Module) -> dict[str, nn.Parameter]:
    """Named trainable parameters (names without the wrapper's `_module.` prefix)."""
    return {
        name.removeprefix("_module."): p for name, p in module.named_parameters() if p.requires_grad
    }


def clipped_grad_sum(
    gsm: GradSampleModule, x: torch.Tensor, y: torch.Tensor, clip_norm: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Σ_i clip(g_i) per parameter and the per-sample norms ‖g_i‖ (B,) before clipping.

    An empty batch gives zero sums (the noisy step still happens, as Poisson sampling requires).
    The wrapper's `grad_sample` and `.grad` are cleared afterwards.
    """
    params = trainable(gsm)
    if x.shape[0] == 0:
        zeros = {name: torch.zeros_like(p) for name, p in params.items()}
        return zeros, torch.zeros(0, device=x.device)
    gsm.train()
    loss = F.cross_entropy(gsm(x), y, reduction="sum")
    loss.backward()
    samples = {name: p.grad_sample for name, p in params.items()}
    norms = torch.stack([g.reshape(g.shape[0], -1).norm(dim=1) for g in samples.values()], 1)
    norms = norms.norm(dim=1)
    factor = (clip_norm / (norms + 1e-6)).clamp(max=1.0)
    sums = {name: torch.einsum("i,i...->...", factor, g) for name, g in samples.items()}
    zero_grad_samples(gsm)
    return sums, norms


def zero_grad_samples(gsm: GradSampleModule) -> None:
    """Drop `.grad_sample` and `.grad` of every parameter (Opacus accumulates them)."""
    for p in gsm.parameters():
        p.grad_sample = None
        p.grad = None


def noisy_step(
    gsm: GradSampleModule,
    optimizer: torch.optim.Optimizer,
    sums: Mapping[str, torch.Tensor],
    noise_std: Mapping[str, torch.Tensor | float],
    expected_batch: float,
    generator: torch.Generator,
) -> None:
    """Set `.grad = (sum + N(0, std²)) / expected_batch` for every parameter, then step."""
    for name, p in trainable(gsm).items():
        std = noise_std[name]
        noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
        if isinstance(std, torch.Tensor):
            noise = noise * std.reshape(-1, *([1] * (p.dim() - 1)))
        else:
            noise = noise * float(std)
        p.grad = (sums[name] + noise) / expected_batch
    optimizer.step()
    zero_grad_samples(gsm)


def plain_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    """Non-private SGD step on the mean cross-entropy of the batch (skipped when empty)."""
    if x.shape[0] == 0:
        return
    model.train()
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
