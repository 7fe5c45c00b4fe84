"""One registry for every network of the three studies: 2D segmentation (seg), the 3D residual
U-Net (fets) and the classifiers (xcal). All are Opacus-valid (GroupNorm, no in-place ops, no
shared modules).

Entries name their class as `module:attribute` and are imported on first use, so reading the
registry (config schema, wildcard patterns, rule files) does not import torch.

`LIMITS` bounds, per model kind, every argument a saved `model.pt` may declare and the
parameter count it may build: `load_model` checks both before allocating anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpmed.errors import DataFormatError
from dpmed.io import atomic_path
from dpmed.registry import Registry, resolve

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
        return resolve(self.target)


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


@dataclass(frozen=True)
class Limit:
    """The values one saved model argument may take: one of `choices` when given, else a number
    in [low, high] (an int when `integer`; never a bool)."""

    low: float = 0
    high: float = 0
    integer: bool = True
    choices: tuple[Any, ...] = ()

    def problem(self, value: Any) -> str | None:
        """Why `value` is not allowed (None when it is)."""
        if self.choices:
            allowed = {(type(c), c) for c in self.choices}
            return None if (type(value), value) in allowed else f"must be one of {self.choices}"
        kinds = (int,) if self.integer else (int, float)
        wanted = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, kinds):
            return f"must be {wanted}, got {type(value).__name__}"
        if not (math.isfinite(value) and self.low <= value <= self.high):
            return f"must be {wanted} in [{self.low:g}, {self.high:g}]"
        return None


@dataclass(frozen=True)
class KindLimits:
    """What a `model.pt` of one model kind may declare: its arguments (an argument not listed
    here is refused) and the number of parameters the declared network may have."""

    arguments: dict[str, Limit] = field(default_factory=dict)
    max_parameters: int = 0


NORMS_3D = ("group", "instance")
LIMITS: dict[str, KindLimits] = {
    "seg2d": KindLimits(
        {"in_channels": Limit(1, 16), "n_classes": Limit(1, 64), "width": Limit(1, 256),
         "depth": Limit(1, 8), "deep_supervision": Limit(choices=(True, False))},
        max_parameters=100_000_000,
    ),
    "seg3d": KindLimits(
        {"in_channels": Limit(1, 16), "n_classes": Limit(1, 64), "base_filters": Limit(1, 128),
         "depth": Limit(1, 6), "norm": Limit(choices=NORMS_3D)},
        max_parameters=100_000_000,
    ),
    "classifier": KindLimits(
        {"in_channels": Limit(1, 4), "n_classes": Limit(1, 1000), "image_size": Limit(28, 224),
         "width_scale": Limit(1e-3, 1.0, integer=False)},
        max_parameters=50_000_000,
    ),
}  # fmt: skip


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


@cache
def parameter_count(name: str, **arguments: Any) -> int:
    """Trainable parameters of registry model `name` built with `arguments` (those it takes),
    to size its jobs. Built once per distinct architecture; a network of this package is then
    kept in `parameter_cache()`, so planning a workflow's jobs imports neither torch nor MONAI
    (seconds per Snakemake call) once its architectures were counted."""
    key = json.dumps([name, arguments], sort_keys=True)
    path = parameter_cache() if MODELS[name].target.startswith(f"{__name__}.") else None
    try:
        counts = json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        counts = {}
    if key not in counts:
        net = build_model(name, **model_arguments(name, arguments))
        counts[key] = sum(p.numel() for p in net.parameters() if p.requires_grad)
        if path:
            with contextlib.suppress(OSError), atomic_path(path) as tmp:
                tmp.write_text(json.dumps(counts, sort_keys=True))
    return counts[key]


@cache
def parameter_cache() -> Path:
    """The cache file of parameter counts (under `$XDG_CACHE_HOME/dpmed`, else `~/.cache/dpmed`),
    named by a digest of this package's sources and the torch and MONAI versions, so a changed
    network is counted again."""
    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.read_bytes())
    for package in ("torch", "monai"):
        digest.update(metadata.version(package).encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "dpmed" / f"parameter_counts-{digest.hexdigest()[:16]}.json"


def save_model(path: str | Path, name: str, arguments: Mapping[str, Any], net: nn.Module) -> None:
    """Write `model.pt` atomically: the registry name, the build arguments and the weights, so
    `load_model` rebuilds the network without the job's config. Identical weights give
    identical bytes."""
    from dpmed.checkpoint import save_state

    save_state(path, {"model": name, "arguments": dict(arguments), "state_dict": net.state_dict()})


def load_model(path: str | Path, device: Any = "cpu") -> nn.Module:
    """The network saved by `save_model`, on `device` and in eval mode. Loaded without running
    pickled code: anything but plain tensors and data is a `DataFormatError`, and so is a
    model name, argument or parameter count outside `LIMITS` or a weight the declared network
    lacks or has in another shape. Nothing is allocated before these checks: the file's
    records must be stored uncompressed and its tensors map the file (`load_state`)."""
    from dpmed.checkpoint import CheckpointRefused, load_state

    try:
        saved = load_state(path, mmap=True)
    except CheckpointRefused as refused:
        raise DataFormatError(path, f"not a dpmed model file: {refused}") from refused
    name, arguments = saved.get("model"), saved.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise DataFormatError(path, "not a dpmed model file: no 'model' name and 'arguments'")
    check_weights(path, check_arguments(path, name, arguments), saved.get("state_dict"))
    net = build_model(name, **arguments)
    try:
        net.load_state_dict(saved.get("state_dict"))
    except (RuntimeError, TypeError, AttributeError) as err:
        raise DataFormatError(path, f"weights do not fit the saved architecture: {err}") from err
    return net.to(device).eval()


def check_arguments(path: str | Path, name: str, arguments: Mapping[str, Any]) -> nn.Module:
    """Refuse, naming `path`, a model `name` that is not registered and `arguments` its
    constructor does not declare, outside its kind's `LIMITS`, that do not build, or that
    build more parameters than the limit (counted on the meta device: nothing is allocated).
    Returns the network built on the meta device."""
    import torch

    if name not in MODELS:
        raise DataFormatError(path, f"unknown model '{name}' (known: {', '.join(MODELS)})")
    kind = MODELS[name].kind
    limits = LIMITS[kind]
    declared = model_parameters(name)
    for key, value in arguments.items():
        if key not in declared:
            raise DataFormatError(path, f"model '{name}' takes no argument '{key}'")
        if key not in limits.arguments:
            raise DataFormatError(path, f"argument '{key}' of model '{name}' is not loadable")
        problem = limits.arguments[key].problem(value)
        if problem:
            raise DataFormatError(
                path, f"argument {key}={value!r} of model '{name}' {problem} ({kind} limit)"
            )
    try:
        with torch.device("meta"):
            shape = build_model(name, **arguments)
    except (TypeError, ValueError) as err:
        raise DataFormatError(path, f"arguments do not build model '{name}': {err}") from err
    count = sum(p.numel() for p in shape.parameters())
    if count > limits.max_parameters:
        raise DataFormatError(
            path,
            f"model '{name}' with {dict(arguments)} has {count:,} parameters, above the "
            f"{kind} limit of {limits.max_parameters:,}",
        )
    return shape


def check_weights(path: str | Path, shape: nn.Module, state_dict: Any) -> None:
    """Refuse, naming `path` and the tensor, a `state_dict` that is not exactly the tensors of
    `shape` (the declared network on the meta device): an entry it lacks, one it does not have,
    one that is no tensor or has another shape. Reads shapes only, never a tensor's values."""
    import torch

    fault = "weights do not fit the saved architecture"
    if not isinstance(state_dict, Mapping):
        raise DataFormatError(path, f"{fault}: 'state_dict' is a {type(state_dict).__name__}")
    expected = shape.state_dict()
    for key, value in state_dict.items():
        if key not in expected:
            raise DataFormatError(path, f"{fault}: the network has no tensor {key!r}")
        if not isinstance(value, torch.Tensor):
            raise DataFormatError(path, f"{fault}: {key!r} is a {type(value).__name__}")
        if value.shape != expected[key].shape:
            raise DataFormatError(
                path,
                f"{fault}: tensor {key!r} has shape {tuple(value.shape)}, the network's "
                f"{tuple(expected[key].shape)}",
            )
    missing = [key for key in expected if key not in state_dict]
    if missing:
        raise DataFormatError(path, f"{fault}: tensor {missing[0]!r} is missing")
