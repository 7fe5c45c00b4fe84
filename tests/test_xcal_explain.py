"""Grad-CAM (vs a direct computation, Opacus state untouched), ROAD and the XCal signal."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from torch import nn

from dpmed.explain.gradcam import grad_cam, normalise
from dpmed.explain.road import impute, removal_mask, road
from dpmed.privacy.dpsgd import clipped_grad_sum, opacus_clip_factors
from dpmed.privacy.dpsgd import wrap_per_sample as wrap
from dpmed.xcal.signal import combine, components, sigma_from_signal, top_q_mask

FLAT_1 = partial(opacus_clip_factors, clip_norm=1.0)  # xcal's flat clipping at C = 1


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4))
        self.act = nn.ReLU(inplace=False)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.act(self.features(x)).mean(dim=(2, 3)))


def direct_cam(net: TinyCNN, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Closed form for this net: y_c = Σ_k W_ck mean(relu(A_k)) + b_c, so
    ∂y_c/∂A_k = W_ck [A_k > 0] / (h w) and a_k is its spatial mean."""
    with torch.no_grad():
        a = net.features(x)
        hw = a.shape[2] * a.shape[3]
        grad = net.fc.weight[target][:, :, None, None] * (a > 0).float() / hw
        weights = grad.mean(dim=(2, 3), keepdim=True)
        return torch.relu((weights * a).sum(dim=1))


def test_grad_cam_matches_the_direct_computation():
    torch.manual_seed(0)
    net = TinyCNN()
    x, target = torch.randn(4, 1, 8, 8), torch.tensor([0, 2, 1, 2])
    cam, logits = grad_cam(net, "features", x, target)
    torch.testing.assert_close(cam, direct_cam(net, x, target), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(logits, net(x))
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_grad_cam_leaves_the_next_dp_step_grad_sample_untouched(mode):
    torch.manual_seed(1)
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 3, (6,))
    reference_net = TinyCNN()
    net = TinyCNN()
    net.load_state_dict(reference_net.state_dict())
    expected, _ = clipped_grad_sum(wrap(reference_net, mode), x, y, FLAT_1)

    gsm = wrap(net, mode)
    gsm.train()
    cam, _ = grad_cam(gsm, "features", x, y)
    assert gsm.training and gsm.hooks_enabled
    assert all(getattr(p, "grad_sample", None) is None and p.grad is None for p in gsm.parameters())
    assert all(not getattr(m, "activations", []) for m in net.modules())
    torch.testing.assert_close(cam, direct_cam(net, x, y), rtol=1e-5, atol=1e-7)
    got, _ = clipped_grad_sum(gsm, x, y, FLAT_1)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value)


def test_imputation_of_a_linear_ramp_is_exact_without_noise():
    h, w = 9, 11
    rows, cols = np.mgrid[0:h, 0:w]
    ramp = np.stack([0.1 * rows + 0.05 * cols, 1.0 - 0.03 * cols + 0.02 * rows])
    removed = np.zeros((h, w), dtype=bool)
    removed[4, 5] = True  # one pixel
    removed[2:5, 2:4] = True  # and a block solved jointly
    out = impute(ramp, removed, noise_std=0.0, rng=np.random.default_rng(0))
    np.testing.assert_allclose(out, ramp, atol=1e-12)


def test_imputation_is_the_weighted_neighbour_mean_and_keeps_known_pixels():
    rng = np.random.default_rng(3)
    image = rng.random((1, 5, 5))
    removed = np.zeros((5, 5), dtype=bool)
    removed[2, 2] = True
    out = impute(image, removed, noise_std=0.0, rng=rng)
    direct = [image[0, 1, 2], image[0, 3, 2], image[0, 2, 1], image[0, 2, 3]]
    diagonal = [image[0, 1, 1], image[0, 1, 3], image[0, 3, 1], image[0, 3, 3]]
    expected = (sum(direct) / 6 + sum(diagonal) / 12) / (4 / 6 + 4 / 12)
    assert out[0, 2, 2] == pytest.approx(expected)
    np.testing.assert_array_equal(out[0][~removed], image[0][~removed])
    noisy = impute(image, removed, noise_std=0.01, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(noisy[0][~removed], image[0][~removed])
    assert noisy[0, 2, 2] != pytest.approx(expected, abs=1e-6)


def test_removal_mask_takes_the_top_or_bottom_fraction():
    att = np.arange(20, dtype=float).reshape(4, 5)
    assert removal_mask(att, 0.25, True).sum() == 5
    assert removal_mask(att, 0.25, True)[3].all()
    assert removal_mask(att, 0.25, False)[0].all()


def _region_model_and_data(n: int = 6, size: int = 16):
    """Class 1 probability rises with the mean brightness of the central square region."""
    region = np.zeros((size, size), dtype=bool)
    region[5:11, 5:11] = True
    images = np.full((n, 1, size, size), 0.1)
    images[:, 0, region] = 0.9

    def predict(batch: np.ndarray) -> np.ndarray:
        z = 12 * (batch[:, 0, region].mean(axis=1) - 0.5)
        p1 = 1 / (1 + np.exp(-z))
        return np.stack([1 - p1, p1], axis=1)

    return predict, images, region


def test_morf_with_a_perfect_attribution_scores_lower_than_with_a_random_one():
    predict, images, region = _region_model_and_data()
    perfect = np.broadcast_to(region.astype(float), (len(images), *region.shape)).copy()
    random = np.random.default_rng(0).random(perfect.shape)
    p = [0.1, 0.2, 0.3]
    good = road(predict, images, perfect, p, seed=0)
    bad = road(predict, images, random, p, seed=0)
    assert np.mean(good["morf"]) < np.mean(bad["morf"]) - 0.2
    assert good["combined"] > bad["combined"]
    assert good["road"] > bad["road"] + 20  # the paper's ROAD: MoRF confidence drop in %
    assert good["base"] == pytest.approx(bad["base"])


def test_top_q_mask_and_signal_components():
    cam = torch.arange(100, dtype=torch.float32).reshape(1, 10, 10)
    mask = top_q_mask(cam, 0.2)
    assert int(mask.sum()) == 20 and bool(mask[0, 8:].all())
    torch.manual_seed(0)
    net = TinyCNN()
    x, y = torch.rand(5, 1, 8, 8), torch.randint(0, 3, (5,))
    parts = components(net, "features", x, y, 0.2)
    for value in parts.values():
        assert value.shape == (5,) and bool(((value >= 0) & (value <= 1)).all())
    s = combine(parts, (1, 0, 0))
    torch.testing.assert_close(s, parts["logit_drop"])
    balanced = combine(parts, (1, 1, 1))
    torch.testing.assert_close(
        balanced, (parts["logit_drop"] + parts["margin"] + parts["concentration"]) / 3
    )


class MeanLogit(nn.Module):
    """Logits (10 m, −10 m) of the image mean m, through a 1×1 conv Grad-CAM can hook: class 0's
    map is the image itself, so its top-q region is the brightest pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Conv2d(1, 1, 1, bias=False)
        self.fc = nn.Linear(1, 2, bias=False)
        with torch.no_grad():
            self.features.weight.fill_(1.0)
            self.fc.weight.copy_(torch.tensor([[10.0], [-10.0]]))

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


def test_alpha_component_is_the_label_logit_change_under_masking():
    # 10 × 10 images, q = 0.2: the top 20 pixels take the image mean. 10 bright pixels: mean 0.1
    # before, 20 · 0.1 / 100 = 0.02 after → z_0 falls 1.0 → 0.2, a logit change of 0.8 (the
    # probability change would be σ(2) − σ(0.4) ≈ 0.282). 20 bright pixels: 2.0 → 0.4, a change
    # of 1.6, clipped to 1. A constant image is unchanged by the masking: 0.
    x = torch.zeros(3, 1, 10, 10)
    x[0].view(-1)[:10] = 1.0
    x[1].view(-1)[:20] = 1.0
    x[2] = 0.3
    parts = components(MeanLogit(), "features", x, torch.zeros(3, dtype=torch.long), 0.2)
    torch.testing.assert_close(parts["logit_drop"], torch.tensor([0.8, 1.0, 0.0]))


def test_concentration_is_one_when_all_saliency_is_in_the_top_q_region():
    cam = torch.zeros(1, 10, 10)
    cam[0, :2, :] = 1.0  # exactly the top 20 %
    mask = top_q_mask(cam, 0.2)
    share = (cam * mask).sum() / cam.sum()
    assert float(share) == 1.0
    assert float(normalise(cam).max()) == 1.0


def test_sigma_map_spans_the_band():
    assert sigma_from_signal(1.0, 2.0, 0.2) == pytest.approx(1.6)
    assert sigma_from_signal(0.0, 2.0, 0.2) == pytest.approx(2.4)
    assert sigma_from_signal(0.5, 2.0, 0.2) == pytest.approx(2.0)
    assert sigma_from_signal(7.0, 2.0, 0.2) == pytest.approx(1.6)
