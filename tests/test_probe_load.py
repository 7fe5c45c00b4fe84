"""Probe class "load": a `model.pt` declaring what no study builds (oversized or non-positive
width/depth, an unknown model or argument, values of the wrong type) or that is damaged is
refused by `load_model` with a `DataFormatError` naming the file, the argument and the limit,
before any network is allocated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import dpmed.models
from dpmed.checkpoint import save_state
from dpmed.errors import DataFormatError
from dpmed.models import MODELS, build_model, load_model

UNET = {"in_channels": 1, "n_classes": 2, "width": 4, "depth": 2}
RESUNET = {"in_channels": 4, "n_classes": 4, "base_filters": 4, "depth": 2}
RESNET = {"in_channels": 3, "n_classes": 8, "image_size": 28, "width_scale": 0.125}
UNSET = object()


def saved(model: Any, arguments: Any, state_dict: Any = UNSET) -> dict[str, Any]:
    return {"model": model, "arguments": arguments,
            "state_dict": {} if state_dict is UNSET else state_dict}  # fmt: skip


# (case id, what model.pt holds or a function writing it, words the problem must contain)
CASES = [
    ("width-4096-depth-6", saved("unet", {**UNET, "width": 4096, "depth": 6}), ["width", "256"]),
    ("depth-50", saved("unet", {**UNET, "depth": 50}), ["depth", "8"]),
    ("unetpp-width-1024", saved("unetpp", {**UNET, "width": 1024}), ["width", "256"]),
    ("resunet3d-base-4096", saved("resunet3d", {**RESUNET, "base_filters": 4096}),
     ["base_filters", "128"]),
    ("resunet3d-depth-12", saved("resunet3d", {**RESUNET, "depth": 12}), ["depth", "6"]),
    ("resnet18-width-scale-64", saved("resnet18", {**RESNET, "width_scale": 64.0}),
     ["width_scale", "1"]),
    ("resnet18-image-100000", saved("resnet18", {**RESNET, "image_size": 100000}),
     ["image_size", "224"]),
    ("efficientnet-classes-1e7", saved("efficientnet_b0", {**RESNET, "n_classes": 10**7}),
     ["n_classes", "1000"]),
    ("in-channels-10000", saved("unet", {**UNET, "in_channels": 10000}), ["in_channels", "16"]),
    ("parameter-count", saved("unet", {**UNET, "width": 256, "depth": 8}),
     ["parameters", "100,000,000"]),
    ("resunet3d-parameter-count", saved("resunet3d", {**RESUNET, "base_filters": 128, "depth": 6}),
     ["parameters", "seg3d"]),
    ("unknown-model", saved("vgg99", UNET), ["unknown model", "vgg99"]),
    ("model-name-not-str", saved(7, UNET), ["model"]),
    ("unknown-argument", saved("unet", {**UNET, "widht": 8}), ["widht"]),
    ("argument-of-another-model", saved("unet", {**UNET, "base_filters": 8}),
     ["base_filters"]),
    ("backbone-path", saved("infnet", {**UNET, "depth": 3, "backbone_weights": "/etc/passwd"}),
     ["backbone_weights", "not loadable"]),
    ("width-zero", saved("unet", {**UNET, "width": 0}), ["width", "[1, 256]"]),
    ("width-negative", saved("unet", {**UNET, "width": -3}), ["width", "[1, 256]"]),
    ("depth-zero", saved("unet", {**UNET, "depth": 0}), ["depth", "[1, 8]"]),
    ("n-classes-zero", saved("unet", {**UNET, "n_classes": 0}), ["n_classes"]),
    ("width-string", saved("unet", {**UNET, "width": "32"}), ["width", "integer", "str"]),
    ("width-float", saved("unet", {**UNET, "width": 32.5}), ["width", "integer", "float"]),
    ("width-bool", saved("unet", {**UNET, "width": True}), ["width", "integer", "bool"]),
    ("depth-none", saved("unet", {**UNET, "depth": None}), ["depth", "NoneType"]),
    ("width-scale-nan", saved("resnet18", {**RESNET, "width_scale": float("nan")}),
     ["width_scale"]),
    ("width-scale-negative", saved("resnet18", {**RESNET, "width_scale": -1.0}),
     ["width_scale"]),
    ("deep-supervision-string", saved("unetpp", {**UNET, "deep_supervision": "yes"}),
     ["deep_supervision", "one of"]),
    ("norm-unknown", saved("resunet3d", {**RESUNET, "norm": "batch"}), ["norm", "group"]),
    ("required-argument-missing", saved("unet", {"n_classes": 2}), ["do not build"]),
    ("arguments-not-a-mapping", saved("unet", [1, 2, 4, 2]), ["arguments"]),
    ("no-model-key", {"arguments": UNET, "state_dict": {}}, ["model"]),
    ("state-dict-mismatch", "mismatch", ["do not fit"]),
    ("state-dict-not-a-mapping", saved("unet", UNET, torch.zeros(3)), ["do not fit"]),
    ("not-a-mapping", [1, 2, 3], ["not a dpmed model file"]),
    ("truncated", "truncated", ["not a dpmed model file"]),
    ("garbage", b"not a zip archive at all" * 4, ["not a dpmed model file"]),
    ("empty-file", b"", ["not a dpmed model file"]),
    ("missing-file", None, ["not a dpmed model file"]),
]  # fmt: skip


def write_case(path: Path, content: Any) -> None:
    """Write `model.pt` for one case (None: leave it missing)."""
    if content is None:
        return
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "truncated":
        save_state(path, saved("unet", UNET, build_model("unet", **UNET).state_dict()))
        path.write_bytes(path.read_bytes()[:-200])
    elif content == "mismatch":
        other = build_model("unet", **{**UNET, "width": 8}).state_dict()
        save_state(path, saved("unet", UNET, other))
    elif isinstance(content, dict):
        save_state(path, content)
    else:
        torch.save(content, path)


@pytest.mark.parametrize(("content", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_model_pt_is_refused_before_allocating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: Any, words: list[str]
) -> None:
    path = tmp_path / "model.pt"
    write_case(path, content)
    real_build = dpmed.models.build_model

    def meta_only(name: str, **arguments: Any) -> torch.nn.Module:
        """Allocating a network on a real device is allowed only for valid arguments."""
        if torch.empty(0).device.type != "meta" and arguments != UNET:
            raise AssertionError(f"allocated {name} {arguments} before refusing them")
        return real_build(name, **arguments)

    monkeypatch.setattr(dpmed.models, "build_model", meta_only)
    with pytest.raises(DataFormatError) as err:
        load_model(path)
    assert err.value.path == str(path)
    for word in words:
        assert word in err.value.problem, err.value


@pytest.mark.parametrize("name", MODELS.names())
def test_the_studies_paper_models_are_within_the_limits(name: str) -> None:
    """The limits refuse no network a study builds at paper size (config/config.yaml)."""
    from dpmed.models import LIMITS, check_arguments

    paper = {"seg2d": {"in_channels": 1, "n_classes": 9, "width": 64, "depth": 4},
             "seg3d": {"in_channels": 4, "n_classes": 4, "base_filters": 32, "depth": 4},
             "classifier": {"in_channels": 3, "n_classes": 8, "image_size": 224,
                            "width_scale": 1.0}}[MODELS[name].kind]  # fmt: skip
    check_arguments("model.pt", name, paper)
    assert set(LIMITS) == {entry.kind for _, entry in MODELS.items()}
