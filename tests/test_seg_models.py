"""The four 2D seg models: Opacus-valid, right shapes, per-sample gradients equal a loop."""

from __future__ import annotations

import pytest
import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator

from dpmed.models import MODELS, build_model, models_of_kind
from dpmed.models.infnet import InfNet
from dpmed.seg.losses import per_sample_loss

SEG_MODELS = ("unet", "unetpp", "lfunet", "infnet")


def make(name: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(name, in_channels=1, n_classes=3, width=4, depth=3, **kw)


@pytest.mark.parametrize("name", SEG_MODELS)
def test_registry_builds_opacus_valid_models(name):
    model = make(name)
    assert ModuleValidator.validate(model, strict=False) == []
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert all(not getattr(m, "inplace", False) for m in model.modules())
    model.eval()
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 3, 16, 16)


@pytest.mark.parametrize("name,n_maps", [("unet", 1), ("unetpp", 3), ("lfunet", 3), ("infnet", 4)])
def test_deep_supervision_outputs_in_training(name, n_maps):
    model = make(name).train()
    out = model(torch.randn(2, 1, 16, 16))
    maps = out["seg"] if isinstance(out, dict) else (out if isinstance(out, list) else [out])
    assert len(maps) == n_maps
    assert all(m.shape == (2, 3, 16, 16) for m in maps)
    if name == "infnet":
        assert out["edge"].shape == (2, 1, 16, 16)


@pytest.mark.parametrize("name", ["unetpp", "lfunet"])
def test_deep_supervision_can_be_switched_off(name):
    out = make(name, deep_supervision=False).train()(torch.randn(1, 1, 16, 16))
    assert isinstance(out, torch.Tensor)


@pytest.mark.parametrize("name", SEG_MODELS)
def test_per_sample_gradients_equal_a_per_sample_loop(name):
    model = make(name).train()
    x, y = torch.randn(3, 1, 16, 16), torch.randint(0, 3, (3, 16, 16))
    expected = []
    for i in range(3):
        model.zero_grad()
        per_sample_loss(model(x[i : i + 1]), y[i : i + 1]).sum().backward()
        expected.append([p.grad.clone() for p in model.parameters()])
    model.zero_grad()
    gsm = GradSampleModule(model, loss_reduction="sum")
    per_sample_loss(gsm(x), y).sum().backward()
    for j, p in enumerate(model.parameters()):
        for i in range(3):
            torch.testing.assert_close(p.grad_sample[i], expected[i][j], atol=1e-5, rtol=1e-4)


def test_misspelt_model_argument_is_an_error_naming_it():
    with pytest.raises(TypeError, match="widht"):
        build_model("unet", in_channels=1, n_classes=2, widht=8, depth=2)


def test_unknown_model_is_named():
    with pytest.raises(ValueError, match="resnet50"):
        build_model("resnet50", in_channels=1, n_classes=2, width=4, depth=2)
    assert set(SEG_MODELS) == set(models_of_kind("seg2d")) <= set(MODELS)


def test_infnet_loads_local_backbone_weights(tmp_path):
    source = InfNet(1, 2, width=4, depth=3)
    path = tmp_path / "backbone.pt"
    torch.save(source.backbone.state_dict(), path)
    loaded = InfNet(1, 2, width=4, depth=3, backbone_weights=path)
    for a, b in zip(
        source.backbone.state_dict().values(), loaded.backbone.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        InfNet(1, 2, width=4, depth=3, backbone_weights=tmp_path / "missing.pt")
    torch.save({"wrong": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="bad.pt"):
        InfNet(1, 2, width=4, depth=3, backbone_weights=tmp_path / "bad.pt")


def test_infnet_needs_three_stages():
    with pytest.raises(ValueError, match="depth"):
        InfNet(1, 2, width=4, depth=2)
