"""Model registry: `build_model(name, **kw)` for every network of the three studies.

`REGISTRY` maps a model name to its constructor; each study module adds its own entries (one
line each). All models are Opacus-valid (GroupNorm, no in-place ops, no shared modules).
The seg factories take one keyword set (in_channels, n_classes, width, depth,
deep_supervision, backbone_weights) and ignore the keywords their model has no use for, so the
training code builds any of them the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from dpmed.models.infnet import InfNet
from dpmed.models.lfunet import LFUNet
from dpmed.models.unet import UNet
from dpmed.models.unetpp import UNetPlusPlus


def _unet(in_channels: int, n_classes: int, width: int, depth: int, **_: object) -> nn.Module:
    return UNet(in_channels, n_classes, width=width, depth=depth)


def _infnet(
    in_channels: int,
    n_classes: int,
    width: int,
    depth: int,
    backbone_weights: str | None = None,
    **_: object,
) -> nn.Module:
    return InfNet(
        in_channels, n_classes, width=width, depth=depth, backbone_weights=backbone_weights
    )


def _unetpp(
    in_channels: int,
    n_classes: int,
    width: int,
    depth: int,
    deep_supervision: bool = True,
    **_: object,
) -> nn.Module:
    return UNetPlusPlus(
        in_channels, n_classes, width=width, depth=depth, deep_supervision=deep_supervision
    )


def _lfunet(
    in_channels: int,
    n_classes: int,
    width: int,
    depth: int,
    deep_supervision: bool = True,
    **_: object,
) -> nn.Module:
    return LFUNet(
        in_channels, n_classes, width=width, depth=depth, deep_supervision=deep_supervision
    )


# 2D segmentation models (seg study).
REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "unet": _unet,
    "unetpp": _unetpp,
    "lfunet": _lfunet,
    "infnet": _infnet,
}


def build_model(name: str, **kw: object) -> nn.Module:
    """Construct model `name` with keyword hyperparameters (see each constructor)."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model '{name}' (known: {', '.join(sorted(REGISTRY))})") from None
    return factory(**kw)
