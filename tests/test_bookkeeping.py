"""The book-keeping DP-SGD engine against a brute-force loop of one backward pass per sample."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import noise_free_dp_step
from torch import nn

from dpmed.models import build_model, model_arguments
from dpmed.privacy.bookkeeping import BookkeepingModule, UnsupportedLayerError
from dpmed.privacy.clipping import ClipRule, private_rules
from dpmed.privacy.dpsgd import ScaledPrivacyEngine, clipped_grad_sum, wrap_per_sample
from dpmed.privacy.grad_sample_mode import (
    AUTO_GRAD_SAMPLE_MODE,
    GRAD_SAMPLE_MODES,
    resolve_grad_sample_mode,
)
from dpmed.seg.losses import per_sample_loss

SEG_MODELS = ("unet", "unetpp", "lfunet", "infnet")
XCAL_MODELS = ("resnet18", "efficientnet_b0")
RTOL = 1e-6


def seg_case(model: str, batch: int = 2):
    """A tiny float64 seg network, a batch of `batch` 16² images and its per-sample loss."""
    torch.manual_seed(0)
    arguments = {"in_channels": 1, "n_classes": 2, "width": 4, "depth": 3}
    net = build_model(model, **model_arguments(model, {**arguments, "deep_supervision": True}))
    x = torch.randn(batch, 1, 16, 16, dtype=torch.float64)
    y = torch.randint(0, 2, (batch, 16, 16))
    return net.double(), x, y, lambda out, target: per_sample_loss(out, target)


def xcal_case(model: str):
    """A tiny float64 classifier (dropout off: the loop must see the same network), 2 images."""
    torch.manual_seed(0)
    net = build_model(model, in_channels=3, n_classes=8, image_size=28, width_scale=0.125)
    for module in net.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    x = torch.rand(2, 3, 28, 28, dtype=torch.float64)
    y = torch.randint(0, 8, (2,))
    return net.double(), x, y, lambda out, target: F.cross_entropy(out, target, reduction="none")


def toy_case(_: str):
    """Every supported layer kind: grouped conv with reflect padding, strided transposed conv,
    Conv3d, GroupNorm, Linear on a sequence (T > 1) and on vectors."""

    class Toy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 4, 3, padding=1)
            self.norm = nn.GroupNorm(2, 4)
            self.grouped = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, padding_mode="reflect")
            self.up = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1)
            self.conv3d = nn.Conv3d(1, 2, (1, 3, 3), padding=(0, 1, 1))
            self.seq = nn.Linear(8, 5)
            self.head = nn.Linear(2 * 4 * 5, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.up(self.grouped(torch.relu(self.norm(self.conv(x)))))  # (B, 4, 8, 8)
            h = self.conv3d(h.unsqueeze(1))  # (B, 2, 4, 8, 8)
            h = self.seq(h.mean(-1))  # (B, 2, 4, 5): T = 8 positions
            return self.head(h.flatten(1))

    torch.manual_seed(0)
    x = torch.randn(3, 2, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 3, (3,))
    return Toy().double(), x, y, lambda out, target: F.cross_entropy(out, target, reduction="none")


def per_sample_grads(net: nn.Module, x: torch.Tensor, y: torch.Tensor, loss) -> dict:
    """name → (B, *shape): one backward pass per sample (the brute force)."""
    rows: dict[str, list[torch.Tensor]] = {}
    net.train()
    for i in range(len(x)):
        net.zero_grad()
        loss(net(x[i : i + 1]), y[i : i + 1]).sum().backward()
        for name, p in net.named_parameters():
            rows.setdefault(name, []).append(p.grad.detach().clone())
    net.zero_grad()
    return {name: torch.stack(r) for name, r in rows.items()}


def assert_close_sums(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name, want in expected.items():
        scale = max(want.norm().item(), 1e-300)
        assert (got[name] - want).norm().item() <= RTOL * scale, name


CASES = (
    [(seg_case, m) for m in SEG_MODELS]
    + [(xcal_case, m) for m in XCAL_MODELS]
    + [(toy_case, "toy")]
)


@pytest.mark.parametrize(("case", "model"), CASES, ids=[m for _, m in CASES])
def test_clipped_sum_equals_per_sample_loop(case, model):
    net, x, y, loss = case(model)
    grads = per_sample_grads(net, x, y, loss)
    norms = torch.stack([g.reshape(len(x), -1).pow(2).sum(1) for g in grads.values()]).sum(0)
    norms = norms.sqrt()
    clip_norm = norms.min().item() * 1.01  # flat clips some samples and leaves others
    seen_ghost = set()
    for ghost, rules in (("always", ["flat"]), ("never", ["flat"]), ("auto", private_rules())):
        bk = BookkeepingModule(net, ghost=ghost)
        for name in rules:
            rule = ClipRule(name, clip_norm)
            result = bk.clipped_sum(loss(bk(x), y), rule.factors, alignment=True)
            s = rule.factors(norms)
            expected = {k: torch.einsum("i,i...->...", s, g) for k, g in grads.items()}
            assert_close_sums(result.sums, expected)
            assert_close_sums(result.unclipped, {k: g.sum(0) for k, g in grads.items()})
            torch.testing.assert_close(result.norms, norms, rtol=RTOL, atol=0)
            seen_ghost.add(bool(result.ghost))
        assert all(p.grad is None for p in net.parameters())  # no ordinary weight gradient
    assert seen_ghost == {True, False}  # both the ghost-norm and the instantiation paths ran


@pytest.mark.parametrize(
    ("layer", "kind"),
    [(nn.BatchNorm2d(4), "BatchNorm2d"), (nn.PReLU(), "PReLU"), (nn.LayerNorm([4, 5, 5]), "")],
)
def test_unsupported_layer_names_the_module(layer, kind):
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Sequential(layer))
    with pytest.raises(UnsupportedLayerError, match=f"'1.0'.*{kind}"):
        BookkeepingModule(net)


def test_shared_module_and_in_place_change_are_refused():
    conv = nn.Conv2d(2, 2, 3, padding=1)
    shared = BookkeepingModule(nn.Sequential(conv, conv))
    with pytest.raises(UnsupportedLayerError, match="runs twice"):
        shared(torch.randn(2, 2, 5, 5))

    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x).relu_()

    bk = BookkeepingModule(InPlace())
    out = bk(torch.randn(4, 3))
    with pytest.raises(RuntimeError, match="'fc' was modified in place"):
        bk.clipped_sum(out.sum(1), ClipRule("flat").factors)


@pytest.mark.parametrize("model", SEG_MODELS)
def test_dp_step_bk_equals_hooks(model):
    """The whole seg optimizer path (noise σ = 0, lr 0): same p.grad and same alignment."""
    net, x, y, _ = seg_case(model)
    twin = copy.deepcopy(net)
    rule = ClipRule("psac", 0.5)
    hooks = noise_free_dp_step(net, x, y, rule, "hooks")
    bk = noise_free_dp_step(twin, x, y, rule, "bk")
    named = dict(twin.named_parameters())
    assert_close_sums(
        {k: named[k].grad for k in named}, {k: p.grad for k, p in net.named_parameters()}
    )
    assert bk.last_alignment.batch_size == hooks.last_alignment.batch_size == 2
    assert bk.last_alignment.clipped_fraction == hooks.last_alignment.clipped_fraction
    assert bk.last_alignment.cosine == pytest.approx(hooks.last_alignment.cosine, rel=RTOL)


def test_bk_empty_batch_step_is_noise_over_expected_batch():
    net = nn.Sequential(nn.Linear(3, 2)).double()
    data = torch.utils.data.TensorDataset(torch.randn(10, 3, dtype=torch.float64))
    dp = ScaledPrivacyEngine(ClipRule("flat", 2.0)).make_private_poisson(
        net,
        torch.optim.SGD(net.parameters(), lr=1.0),
        data,
        sample_rate=0.5,
        noise_multiplier=1.0,
        grad_sample_mode="bk",
        generator=torch.Generator().manual_seed(0),
    )
    before = [p.detach().clone() for p in net.parameters()]
    dp.optimizer.zero_grad()
    dp.step_empty()
    moved = torch.cat(
        [(b - p.detach()).flatten() for b, p in zip(before, net.parameters(), strict=True)]
    )
    assert moved.abs().min() > 0  # noise σ·C/(q·N) on every coordinate, no sample term
    assert len(dp.engine.accountant.history) == 1


@pytest.mark.parametrize("model", XCAL_MODELS)
def test_xcal_functional_step_bk_equals_opacus(model):
    net, x, y, _ = xcal_case(model)
    factors = ClipRule("flat", 0.1).factors
    expected, expected_norms = clipped_grad_sum(
        wrap_per_sample(copy.deepcopy(net), net.grad_sample_mode), x, y, factors
    )
    got, norms = clipped_grad_sum(wrap_per_sample(net, "bk"), x, y, factors)
    assert_close_sums(got, expected)
    torch.testing.assert_close(norms, expected_norms, rtol=RTOL, atol=0)


def test_bk_is_a_mode_and_auto_stays_static():
    assert "bk" in GRAD_SAMPLE_MODES
    assert resolve_grad_sample_mode("bk", "unet") == "bk"
    for model, mode in AUTO_GRAD_SAMPLE_MODE.items():
        assert resolve_grad_sample_mode("auto", model) == mode
