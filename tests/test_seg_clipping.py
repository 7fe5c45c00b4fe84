"""Clipping rules inside Opacus: summed gradient vs a brute-force loop, norm bound, noise std,
accounting (paper 002 Table 1), and a toy rule registered in one place running a real DP step."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import noise_free_dp_step
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant
from torch import nn
from torch.utils.data import TensorDataset

from dpmed.models import build_model
from dpmed.privacy import accounting
from dpmed.privacy.clipping import (
    CLIP_RULES,
    ClipRule,
    paper_column_order,
    private_rules,
    register_clip_rule,
    report_order,
)
from dpmed.privacy.dpsgd import ScaledDPOptimizer, ScaledPrivacyEngine
from dpmed.privacy.grad_sample_mode import resolve_grad_sample_mode
from dpmed.seg.losses import per_sample_loss
from dpmed.seg.report.privacy import clip_rule_table

C, GAMMA, R = 0.7, 0.01, 0.1
PRIVATE_RULES = private_rules()


def formula(name: str, n: float, c: float = C) -> float:
    """Table 1 of paper 002 with the factor C kept (closed forms written out again)."""
    return {
        "flat": min(1.0, c / n) if n > 0 else 1.0,
        "autos": c / (n + GAMMA),
        "nsgd": c / (n + R),
        "psac": c / (n + R / (n + R)),
    }[name]


@pytest.mark.parametrize("name", PRIVATE_RULES)
def test_factors_match_the_formulas(name):
    rule = ClipRule(name, clip_norm=C, gamma=GAMMA, r=R)
    norms = torch.tensor([0.0, 1e-6, 0.05, 0.7, 3.0, 1e4], dtype=torch.float64)
    got = rule.factors(norms)
    for n, s in zip(norms.tolist(), got.tolist(), strict=True):
        assert s == pytest.approx(formula(name, n), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(PRIVATE_RULES),
    norms=st.lists(
        st.one_of(st.floats(0, 1e-8), st.floats(1e-8, 1e3), st.floats(1e3, 1e30)),
        min_size=1,
        max_size=16,
    ),
    clip=st.floats(1e-3, 1e3),
)
def test_every_scaled_gradient_norm_is_at_most_c(name, norms, clip):
    rule = ClipRule(name, clip_norm=clip, gamma=GAMMA, r=R)
    n = torch.tensor(norms, dtype=torch.float64)
    scaled = n * rule.factors(n)
    assert bool((scaled <= clip * (1 + 1e-12)).all())
    assert bool((rule.factors(n) > 0).all())


def test_none_rule_cannot_drive_dp_sgd():
    with pytest.raises(ValueError, match="bounded"):
        ScaledPrivacyEngine(ClipRule("none"))


def _tiny_net() -> nn.Module:
    torch.manual_seed(1)
    return build_model("unet", in_channels=1, n_classes=3, width=2, depth=1)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    x = (
        torch.randn(5, 1, 8, 8, generator=g)
        * torch.tensor([0.01, 0.3, 1.0, 5.0, 30.0])[:, None, None, None]
    )
    return x, torch.randint(0, 3, (5, 8, 8), generator=g)


def _check_against_brute_force(name: str, factor, mode: str) -> None:
    """One noise-free DP step of clip rule `name` through Opacus equals the mean over samples
    of factor(‖g_i‖, C)·g_i from one autograd pass per sample; C splits the norms (flat clips
    some samples and leaves others)."""
    net = _tiny_net()
    x, y = _batch()
    per_sample = []
    for i in range(len(x)):
        net.zero_grad()
        per_sample_loss(net(x[i : i + 1]), y[i : i + 1]).sum().backward()
        per_sample.append([p.grad.clone() for p in net.parameters()])
    norms = [math.sqrt(sum(float((g**2).sum()) for g in grads)) for grads in per_sample]
    ranked = sorted(norms)
    clip = (ranked[1] + ranked[2]) / 2
    rule = ClipRule(name, clip_norm=clip, gamma=GAMMA, r=R)
    expected = [
        sum(factor(n, clip) * grads[j] for n, grads in zip(norms, per_sample, strict=True)) / len(x)
        for j in range(len(per_sample[0]))
    ]
    net.zero_grad()
    noise_free_dp_step(net, x, y, rule, mode)
    for p, e in zip(net.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, e, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ghost"])
@pytest.mark.parametrize("name", PRIVATE_RULES)
def test_summed_gradient_equals_brute_force_loop(name, mode):
    _check_against_brute_force(name, lambda n, clip: formula(name, n, clip), mode)


def test_registry_orders_and_names():
    assert CLIP_RULES.names() == ("none", "flat", "nsgd", "autos", "psac")
    assert report_order() == ("none", "flat", "autos", "nsgd", "psac")
    assert paper_column_order(baseline_first=True) == ("none", "autos", "flat", "nsgd", "psac")
    assert paper_column_order(baseline_first=False) == ("autos", "flat", "nsgd", "psac", "none")
    assert PRIVATE_RULES == ("flat", "nsgd", "autos", "psac")
    with pytest.raises(ValueError, match="unknown clip rule 'half' .known: none, flat"):
        ClipRule("half")


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_a_fifth_rule_is_one_registration(mode):
    """A toy rule "half" (s(n) = min(1, C/n)/2, so n·s(n) ≤ C/2) registered in one place: it
    drives a real DP step equal to the brute-force sum, gets its Table 1 row and its place in
    the report orders, and is gone after `CLIP_RULES.remove`."""

    @register_clip_rule(
        "half",
        label="Half",
        rank=5,
        paper_column=5,
        formula="min(1, C/n)/2",
        hard_clip=False,
        constants=(),
        paper_mechanism="min(1, C/‖g_i‖)/2",
        limitation="halves every step",
        reference="this test",
    )
    def half(norms, rule):
        c = rule.clip_norm
        return c / norms.where(norms > c, norms.new_full(norms.shape, c)) / 2

    try:
        assert ClipRule("half").bounded and "half" in private_rules()
        assert report_order()[-1] == "half" and paper_column_order(False)[-2:] == ("half", "none")
        _check_against_brute_force("half", lambda n, clip: min(1.0, clip / n) / 2, mode)
        row = clip_rule_table().iloc[-1]
        assert (row["rule"], row["label"], row["sensitivity"]) == ("half", "Half", "C")
        assert row["scale_factor"] == "s(n) = min(1, C/n)/2"
    finally:
        CLIP_RULES.remove("half")
    assert "half" not in CLIP_RULES and "half" not in private_rules()


@pytest.mark.parametrize("name", PRIVATE_RULES)
def test_noise_std_is_sigma_times_c(name):
    torch.manual_seed(0)
    layer = nn.Linear(200, 100, bias=False)
    sigma, clip = 1.3, 0.5
    opt = ScaledDPOptimizer(
        torch.optim.SGD(layer.parameters(), lr=0.0),
        rule=ClipRule(name, clip_norm=clip),
        noise_multiplier=sigma,
        expected_batch_size=1,
    )
    layer.weight.grad_sample = torch.zeros((1, 100, 200))  # zero gradient: p.grad is pure noise
    opt.step()
    std = float(layer.weight.grad.std())
    assert std == pytest.approx(sigma * clip, rel=0.03)  # 20000 draws: sd of std ≈ 0.5 %


def test_accounting_one_step_per_batch_matches_opacus():
    net = _tiny_net()
    x, y = torch.randn(20, 1, 8, 8), torch.randint(0, 3, (20, 8, 8))
    engine = ScaledPrivacyEngine(ClipRule("autos"), accountant="rdp")
    dp = engine.make_private_poisson(
        net,
        torch.optim.SGD(net.parameters(), lr=0.01),
        TensorDataset(x, y),
        sample_rate=0.25,
        noise_multiplier=1.1,
        grad_sample_mode="hooks",
        generator=torch.Generator().manual_seed(0),
    )
    batches = 0
    for _ in range(2):
        for xb, yb in dp.loader:
            dp.optimizer.zero_grad()
            if len(yb) == 0:
                dp.step_empty()
            else:
                dp.backward(per_sample_loss(dp.module(xb), yb))
                dp.optimizer.step()
            batches += 1
    assert batches == 2 * int(1 / 0.25)
    assert engine.accountant.history == [(1.1, 0.25, batches)]
    reference = RDPAccountant()
    for _ in range(batches):
        reference.step(noise_multiplier=1.1, sample_rate=0.25)
    assert accounting.epsilon(engine.accountant.history, 1e-5, "rdp") == pytest.approx(
        reference.get_epsilon(1e-5), rel=1e-9
    )


def test_empty_poisson_batch_is_a_noise_only_accounted_step():
    net = _tiny_net()
    before = [p.detach().clone() for p in net.parameters()]
    engine = ScaledPrivacyEngine(ClipRule("flat"))
    dp = engine.make_private_poisson(
        net,
        torch.optim.SGD(net.parameters(), lr=1.0),
        TensorDataset(torch.randn(4, 1, 8, 8)),
        sample_rate=0.5,
        noise_multiplier=1.0,
        grad_sample_mode="hooks",
    )
    dp.step_empty()
    assert engine.accountant.history == [(1.0, 0.5, 1)]
    assert any(not torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))


def test_calibrated_noise_meets_the_target():
    sigma = accounting.noise_multiplier(8.0, 1e-5, 0.1, 100, "rdp")
    assert accounting.epsilon([(sigma, 0.1, 100)], 1e-5, "rdp") <= 8.0 + 0.01


def test_auto_mode_per_model():
    assert resolve_grad_sample_mode("auto", "infnet") in ("hooks", "functorch", "ghost", "bk")
    assert resolve_grad_sample_mode("ghost", "unet") == "ghost"
    with pytest.raises(ValueError, match="bogus"):
        resolve_grad_sample_mode("bogus", "unet")


@settings(max_examples=200, deadline=None)
@given(
    st.floats(1e-6, 1e6, allow_nan=False),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=16),
)
def test_flat_factor_is_exactly_one_up_to_the_clip_norm(clip, fractions):
    """Flat clipping counts a sample as clipped when s(n) < 1 (the alignment's clipped share):
    every n ≤ C, n = C included, has s = 1 exactly, every n > C has C/n. C/C computed as a
    reciprocal times C is 1 − 2⁻⁵³ on some CPUs, which counted unclipped samples as clipped."""
    norms = torch.tensor([clip * f for f in fractions] + [clip, clip * 2], dtype=torch.float64)
    factors = ClipRule("flat", clip_norm=clip).factors(norms)
    assert (factors[norms <= clip] == 1).all()
    above = norms > clip
    assert torch.equal(factors[above], clip / norms[above])
