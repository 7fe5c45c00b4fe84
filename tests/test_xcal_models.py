"""xcal classifiers: shapes at 1/3 channels and 28²–224², Opacus validity, Grad-CAM layer size,
per-sample gradients of the fast mode equal a per-sample loop."""

from __future__ import annotations

import pytest
import torch
from opacus.validators import ModuleValidator
from torch import nn

from dpmed.models import build_model, load_model, save_model
from dpmed.models.classifiers import feature_sizes, gradcam_layer
from dpmed.privacy.dpsgd import wrap_per_sample
from dpmed.xcal.grid import MODELS


def classifier(name, in_channels, n_classes, image_size, width_scale=1.0):
    return build_model(
        name,
        in_channels=in_channels,
        n_classes=n_classes,
        image_size=image_size,
        width_scale=width_scale,
    )


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("channels", "size"), [(1, 28), (3, 64), (3, 224)])
def test_shapes_validity_and_cam_layer(name, channels, size):
    net = classifier(name, channels, 5, size, width_scale=0.125)
    assert ModuleValidator.validate(net, strict=False) == []
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    assert all(not getattr(m, "inplace", False) for m in net.modules())
    net.eval()
    with torch.no_grad():
        assert net(torch.rand(2, channels, size, size)).shape == (2, 5)
    layer = gradcam_layer(net, channels, size)
    sizes = feature_sizes(net, channels, size)
    assert sizes[layer] >= 7
    deeper = net.cam_candidates()[net.cam_candidates().index(layer) + 1 :]
    assert all(sizes[d] < 7 for d in deeper)


def test_full_width_resnet18_has_the_published_size():
    net = classifier("resnet18", 3, 1000, 224)
    # torchvision's resnet18 count: GroupNorm has the same affine parameters as BatchNorm.
    assert sum(p.numel() for p in net.parameters()) == 11_689_512
    assert gradcam_layer(net, 3, 224) == "layer4"


@pytest.mark.parametrize("name", MODELS)
def test_fast_mode_per_sample_gradients_equal_a_loop(name):
    torch.manual_seed(0)
    # float64: GroupNorm over 1×1 maps deep in EfficientNet amplifies float32 round-off.
    net = classifier(name, 3, 4, 28, width_scale=0.125).double()
    for m in net.modules():  # train mode (Opacus captures activations only then), no dropout
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    x, y = torch.rand(3, 3, 28, 28, dtype=torch.float64), torch.tensor([0, 3, 1])
    loop = []
    for i in range(3):
        net.zero_grad()
        nn.functional.cross_entropy(net(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
        loop.append({n: p.grad.clone() for n, p in net.named_parameters()})
    net.zero_grad()
    # Opacus' per-sample rows (the models' own engine, bk, is tested in test_bookkeeping.py)
    gsm = wrap_per_sample(net, "functorch" if name == "efficientnet_b0" else "hooks")
    nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    for n, p in net.named_parameters():
        for i in range(3):
            torch.testing.assert_close(p.grad_sample[i], loop[i][n], rtol=1e-7, atol=1e-9)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="in_channels"):
        classifier("resnet18", 2, 3, 28)
    with pytest.raises(ValueError, match="image_size"):
        classifier("resnet18", 3, 3, 16)
    with pytest.raises(ValueError, match="unknown model 'vgg'.*efficientnet_b0"):
        classifier("vgg", 3, 3, 28)
    with pytest.raises(TypeError, match="widht_scale"):
        build_model("resnet18", in_channels=3, n_classes=3, image_size=28, widht_scale=0.5)


@pytest.mark.parametrize("name", MODELS)
def test_model_pt_rebuilds_the_classifier(tmp_path, name):
    arguments = {"in_channels": 1, "n_classes": 4, "image_size": 28, "width_scale": 0.125}
    net = build_model(name, **arguments)
    save_model(tmp_path / "model.pt", name, arguments, net)
    loaded = load_model(tmp_path / "model.pt")
    x = torch.rand(2, 1, 28, 28)
    net.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), net(x), rtol=0, atol=0)
