"""Model registry of the seg study: `build_model(name, **kw)` for the 2D segmentation networks.

`REGISTRY` maps a model name to its constructor (the fets study builds `resunet3d.ResUNet3d`,
the xcal study `classifiers.build_classifier`). All models are Opacus-valid (GroupNorm, no
in-place ops, no shared modules).
The seg factories take one keyword set (in_channels, n_classes, width, depth,
deep_supervision, backbone_weights) and ignore the keywords their model has no use for, so the
training code builds any of them the same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from dpmed.models.infnet import InfNet
from dpmed.models.lfunet import LFUNet
from dpmed.models.unet import UNet
from dpmed.models.unetpp import UNetPlusPlus


def _accepting(model: type[nn.Module]) -> Callable[..., nn.Module]:
    """A factory passing `model` only the keywords its constructor declares, so the training
    code builds every seg model from one keyword set."""
    names = set(inspect.signature(model).parameters)

    def factory(**kw: object) -> nn.Module:
        return model(**{key: value for key, value in kw.items() if key in names})

    return factory


# 2D segmentation models (seg study).
REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "unet": _accepting(UNet),
    "unetpp": _accepting(UNetPlusPlus),
    "lfunet": _accepting(LFUNet),
    "infnet": _accepting(InfNet),
}


def build_model(name: str, **kw: object) -> nn.Module:
    """Construct model `name` with keyword hyperparameters (see each constructor)."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model '{name}' (known: {', '.join(sorted(REGISTRY))})") from None
    return factory(**kw)
