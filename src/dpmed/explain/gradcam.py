"""Grad-CAM (Selvaraju et al. 2017) with a hand-written hook, safe beside Opacus' wrapper.

For a feature map A ∈ R^{B×K×h×w} and class scores y_c (logits), the channel weights are
a_k = mean_{h,w} ∂y_c/∂A_k and the map is ReLU(Σ_k a_k A_k) ∈ R^{B×h×w} (unnormalised; higher =
more evidence for class c). Every sample uses its own class index (MONAI's GradCAM does not).

Under Opacus the per-sample-gradient hooks must not see this backward pass: it
would capture activations and write `grad_sample`. `grad_cam` therefore disables the wrapper's
hooks, switches to eval mode, differentiates only w.r.t. the feature map (no parameter `.grad`
is touched), then restores hooks and mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn


@contextlib.contextmanager
def quiet(module: nn.Module) -> Iterator[nn.Module]:
    """Eval mode with Opacus hooks disabled (if `module` is a GradSampleModule); yields the
    plain network. Mode and hooks are restored on exit."""
    inner = getattr(module, "_module", module)
    hooked = hasattr(module, "disable_hooks") and getattr(module, "hooks_enabled", False)
    was_training = module.training
    if hooked:
        module.disable_hooks()
    module.eval()
    try:
        yield inner
    finally:
        module.train(was_training)
        if hooked:
            module.enable_hooks()


def grad_cam(
    module: nn.Module, layer: str, x: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grad-CAM maps (B, h, w) of `layer` for classes `target` (B,), and the logits (B, K).

    `module` may be the network or its Opacus wrapper; `layer` is a name from
    `named_modules()` of the network.
    """
    with quiet(module) as net:
        store: list[torch.Tensor] = []
        handle = dict(net.named_modules())[layer].register_forward_hook(
            lambda _m, _i, out: store.append(out)
        )
        try:
            with torch.enable_grad():
                logits = net(x)
                score = logits.gather(1, target.reshape(-1, 1)).sum()
                (grads,) = torch.autograd.grad(score, store[0])
        finally:
            handle.remove()
        weights = grads.mean(dim=(2, 3), keepdim=True)
        cam = F.relu((weights * store[0]).sum(dim=1))
    return cam.detach(), logits.detach()


def upsample(cam: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of maps (B, h, w) to (B, size, size) (values stay ≥ 0)."""
    out = F.interpolate(cam[:, None], size=(size, size), mode="bilinear", align_corners=False)
    return out[:, 0].clamp(min=0)


def normalise(cam: torch.Tensor) -> torch.Tensor:
    """Scale each map to max 1 (an all-zero map stays zero)."""
    peak = cam.flatten(1).amax(dim=1).clamp(min=1e-12)
    return cam / peak.reshape(-1, *([1] * (cam.dim() - 1)))
