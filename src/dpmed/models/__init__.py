"""One registry for every network of the three studies: 2D segmentation (seg), the 3D residual
U-Net (fets) and the classifiers (xcal). All are Opacus-valid (GroupNorm, no in-place ops, no
shared modules).

Entries name their class as `module:attribute` and are imported on first use, so reading the
registry (config schema, wildcard patterns, rule files) does not import torch.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpmed.errors import DataFormatError
from dpmed.registry import Registry

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ModelEntry:
    """A registered network.

    Args:
        target: `module:attribute` of the constructor (a class or a factory function).
        kind: `seg2d`, `seg3d` or `classifier` (which study can use it).
        label: the name papers and figures use ("UNet++").
    """

    target: str
    kind: str
    label: str

    def constructor(self) -> Callable[..., nn.Module]:
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


MODELS: Registry[ModelEntry] = Registry("model")
MODELS.add("unet", ModelEntry("dpmed.models.unet:UNet", "seg2d", "UNet"))
MODELS.add("unetpp", ModelEntry("dpmed.models.unetpp:UNetPlusPlus", "seg2d", "UNet++"))
MODELS.add("lfunet", ModelEntry("dpmed.models.lfunet:LFUNet", "seg2d", "LFUNet"))
MODELS.add("infnet", ModelEntry("dpmed.models.infnet:InfNet", "seg2d", "Inf-Net"))
MODELS.add("resunet3d", ModelEntry("dpmed.models.resunet3d:ResUNet3d", "seg3d", "3D ResUNet"))
MODELS.add("resnet18", ModelEntry("dpmed.models.classifiers:ResNet18", "classifier", "ResNet-18"))
MODELS.add(
    "efficientnet_b0",
    ModelEntry("dpmed.models.efficientnet:EfficientNetB0", "classifier", "EfficientNet-B0"),
)


def models_of_kind(kind: str) -> tuple[str, ...]:
    """Registered model names of one kind, in registration order."""
    return tuple(name for name, entry in MODELS.items() if entry.kind == kind)


def model_parameters(name: str) -> tuple[str, ...]:
    """The keyword arguments the constructor of model `name` declares."""
    return tuple(inspect.signature(MODELS[name].constructor()).parameters)


def build_model(name: str, **arguments: Any) -> nn.Module:
    """Construct model `name`; an argument its constructor does not declare is an error naming
    it (a misspelt `widht=8` must not silently build the default width)."""
    constructor = MODELS[name].constructor()
    declared = set(inspect.signature(constructor).parameters)
    unknown = sorted(set(arguments) - declared)
    if unknown:
        raise TypeError(
            f"model '{name}' takes no argument(s) {', '.join(unknown)} "
            f"(it takes: {', '.join(sorted(declared))})"
        )
    return constructor(**arguments)


def model_arguments(name: str, available: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `available` that model `name` declares: a study whose config holds the
    union of its models' hyperparameters (seg: width, depth, deep_supervision, …) builds each
    model from the keys it takes. Keys come from the validated config, so none is misspelt."""
    declared = model_parameters(name)
    return {key: available[key] for key in declared if key in available}


def save_model(path: str | Path, name: str, arguments: Mapping[str, Any], net: nn.Module) -> None:
    """Write `model.pt` atomically: the registry name, the build arguments and the weights, so
    `load_model` rebuilds the network without the job's config. Identical weights give
    identical bytes."""
    from dpmed.checkpoint import save_state

    save_state(path, {"model": name, "arguments": dict(arguments), "state_dict": net.state_dict()})


def load_model(path: str | Path, device: Any = "cpu") -> nn.Module:
    """The network saved by `save_model`, on `device` and in eval mode. Loaded without running
    pickled code: anything but plain tensors and data is a `DataFormatError`."""
    from dpmed.checkpoint import CheckpointRefused, load_state

    try:
        saved = load_state(path)
    except CheckpointRefused as refused:
        raise DataFormatError(path, f"not a dpmed model file: {refused}") from refused
    net = build_model(saved["model"], **saved["arguments"])
    try:
        net.load_state_dict(saved["state_dict"])
    except RuntimeError as err:
        raise ValueError(f"{path}: weights do not fit the saved architecture: {err}") from err
    return net.to(device).eval()
