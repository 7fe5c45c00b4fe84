"""xcal privacy: RDP ledger vs Opacus, the Rényi filter, the DP-SGD step and AGP's noise (the
paper's reading `agp` and the sound `agp-dp`)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant
from torch import nn
from torch.utils.data import TensorDataset

from dpmed.privacy.accounting import noise_multiplier
from dpmed.privacy.adaptive import ORDERS, RdpLedger, RenyiFilter
from dpmed.privacy.clipping import ClipRule
from dpmed.privacy.dpsgd import (
    ScaledPrivacyEngine,
    clipped_grad_sum,
    noisy_step,
    opacus_clip_factors,
    trainable,
)
from dpmed.privacy.dpsgd import wrap_per_sample as wrap
from dpmed.xcal.methods import METHODS


@pytest.mark.parametrize(("sigma", "q", "steps"), [(1.1, 0.01, 300), (0.8, 0.1, 40), (3.0, 1.0, 5)])
def test_ledger_matches_opacus_rdp_for_a_static_schedule(sigma, q, steps):
    ledger = RdpLedger()
    for _ in range(steps):
        ledger.charge(q, sigma)
    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    assert ledger.epsilon(1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert ledger.history == [[sigma, q, steps]]


def test_ledger_sums_heterogeneous_steps_like_opacus_history():
    ledger = RdpLedger()
    schedule = [(1.0, 0.05, 3), (1.4, 0.05, 2), (1.0, 0.05, 4)]
    for sigma, q, n in schedule:
        ledger.charge(q, sigma, n)
    acc = RDPAccountant()
    acc.history = list(schedule)
    assert ledger.epsilon(1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def _filter(eps: float = 2.0, q: float = 0.05, steps: int = 60, band: float = 0.2) -> RenyiFilter:
    sigma = noise_multiplier(eps, 1e-5, q, steps)
    return RenyiFilter.for_target(eps, 1e-5, q, sigma, steps, (1 + band) * sigma), sigma


@settings(max_examples=25, deadline=None)
@given(
    factors=st.lists(st.floats(0.3, 1.2), min_size=1, max_size=150),
    eps=st.sampled_from([0.5, 2.0, 8.0]),
)
def test_filter_never_lets_the_ledger_exceed_the_target(factors, eps):
    """An overspending σ schedule (down to 0.3 σ_ref, longer than planned) stays within ε."""
    flt, sigma_ref = _filter(eps=eps)
    used = []
    for f in factors:
        if not flt.can_continue():
            break
        sigma = flt.admit(f * sigma_ref)
        if sigma is None:
            break
        assert sigma >= f * sigma_ref
        assert sigma <= flt.sigma_max * (1 + 1e-12)
        used.append(sigma)
        assert flt.spent() <= flt.budget * (1 + 1e-12)
        assert flt.ledger.epsilon(1e-5) <= eps * (1 + 1e-9)
    assert sum(h[2] for h in flt.ledger.history) == len(used)


def test_filter_halts_a_schedule_that_would_overspend():
    flt, sigma_ref = _filter(eps=1.0, steps=50)
    admitted = 0
    for _ in range(500):  # 10× the planned steps at the smallest σ of the band
        if flt.admit(0.8 * sigma_ref) is None:
            break
        admitted += 1
    assert flt.halted and flt.raised > 0
    assert 0 < admitted < 500
    assert flt.ledger.epsilon(1e-5) <= 1.0


@settings(max_examples=15, deadline=None)
@given(factors=st.lists(st.floats(1.0, 1.2), min_size=1, max_size=60))
def test_filter_never_intervenes_on_a_schedule_that_fits(factors):
    """σ_t ≥ σ_ref for at most the planned number of steps always fits: admitted unchanged."""
    flt, sigma_ref = _filter(steps=60)
    for f in factors:
        assert flt.admit(f * sigma_ref) == f * sigma_ref
    assert flt.raised == 0 and not flt.halted


def test_filter_order_and_budget_reproduce_the_target_for_the_reference_schedule():
    flt, sigma_ref = _filter(eps=2.0, steps=60)
    acc = RDPAccountant()
    acc.history = [(sigma_ref, 0.05, 60)]
    eps_ref, alpha = acc.get_privacy_spent(delta=1e-5)
    assert flt.order == alpha
    spent = RdpLedger()
    spent.charge(0.05, sigma_ref, 60)
    assert spent.rdp[ORDERS.index(alpha)] <= flt.budget
    assert eps_ref <= 2.0


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.norm = nn.GroupNorm(1, 2)
        self.fc = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.norm(self.conv(x))), 1))


# The xcal clipping (Opacus' factor) and a seg clip rule, through the one functional step.
FACTORS = {
    "opacus_flat": (lambda n: opacus_clip_factors(n, 0.5), lambda n: min(1.0, 0.5 / (n + 1e-6))),
    "nsgd": (ClipRule("nsgd", clip_norm=0.5, r=0.1).factors, lambda n: 0.5 / (n + 0.1)),
}


@pytest.mark.parametrize("factors", FACTORS)
@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_clipped_sum_matches_a_per_sample_loop(mode, factors):
    torch.manual_seed(0)
    net = Tiny()
    x, y = torch.randn(5, 1, 6, 6), torch.randint(0, 3, (5,))
    expected = {name: torch.zeros_like(p) for name, p in net.named_parameters()}
    norms = []
    tensor_factors, scalar_factor = FACTORS[factors]
    for i in range(5):
        net.zero_grad()
        nn.functional.cross_entropy(net(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
        grads = {name: p.grad.clone() for name, p in net.named_parameters()}
        n = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
        norms.append(n)
        for name, g in grads.items():
            expected[name] += g * scalar_factor(n)
    net.zero_grad()
    gsm = wrap(net, mode)
    sums, got_norms = clipped_grad_sum(gsm, x, y, tensor_factors)
    np.testing.assert_allclose(got_norms.numpy(), norms, rtol=1e-5)
    for name, value in expected.items():
        torch.testing.assert_close(sums[name], value, rtol=1e-5, atol=1e-6)
    assert all(p.grad_sample is None and p.grad is None for p in gsm.parameters())


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_the_functional_step_and_the_opacus_optimizer_clip_alike(mode):
    """The two fronts of the one DP-SGD engine (xcal's functional step, seg's optimizer) give
    the same clipped sum for the same clip rule."""
    torch.manual_seed(0)
    net, twin = Tiny(), Tiny()
    twin.load_state_dict(net.state_dict())
    x, y = torch.randn(5, 1, 6, 6), torch.randint(0, 3, (5,))
    rule = ClipRule("psac", clip_norm=0.5)
    dp = ScaledPrivacyEngine(rule).make_private_poisson(
        net,
        torch.optim.SGD(net.parameters(), lr=0.0),
        TensorDataset(x, y),
        sample_rate=1.0,
        noise_multiplier=0.0,
        grad_sample_mode=mode,
    )
    dp.optimizer.zero_grad()
    dp.backward(nn.functional.cross_entropy(dp.module(x), y, reduction="none"))
    dp.optimizer.step()  # grad = clipped sum / expected batch (5), lr 0
    sums, _ = clipped_grad_sum(wrap(twin, mode), x, y, rule.factors)
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.grad * 5, sums[name], rtol=1e-5, atol=1e-6)


def test_noisy_step_adds_noise_of_the_stated_std_per_channel():
    net = nn.Linear(400, 3, bias=False)
    gsm = wrap(net, "hooks")
    opt = torch.optim.SGD(gsm.parameters(), lr=1.0)
    before = net.weight.detach().clone()
    std = {"weight": torch.tensor([1.0, 2.0, 4.0])}
    zero = {"weight": torch.zeros(3, 400)}
    noisy_step(gsm, opt, zero, std, expected_batch=2.0, generator=torch.Generator().manual_seed(0))
    change = (before - net.weight.detach()) * 2.0  # grad = noise / expected batch, lr = 1
    np.testing.assert_allclose(change.std(dim=1).numpy(), [1.0, 2.0, 4.0], rtol=0.15)


def _hand_protected(weight: list[list[float]], share: float) -> set[int]:
    """Indices of the ceil(share · C0) (at least one) rows of largest L2 norm, by a plain loop."""
    norms = [math.sqrt(sum(v * v for v in row)) for row in weight]
    k = max(1, math.ceil(share * len(norms)))
    return set(sorted(range(len(norms)), key=lambda i: -norms[i])[:k])


def _agp_std(method: str, global_state: dict, module: nn.Module, sigma_ref: float, **params):
    """The noise std `method`'s round gives each channel (`Method.round_noise`)."""
    account = SimpleNamespace(params=params, state=SimpleNamespace(sigma_ref=sigma_ref))
    return METHODS[method].round_noise(account, module, global_state)


def test_agp_puts_fixed_noise_only_outside_the_protected_channels():
    """Paper 001's AGP: one magnitude σ·C on every channel but the top q share by weight norm
    of the global model, which gets none; a conv tensor ranks its output channels over all of
    their weights."""
    rng = np.random.default_rng(3)
    conv = (
        rng.normal(size=(7, 2, 3, 3))
        * np.array([0.1, 3, 0.2, 2, 0.5, 0.05, 1.5])[:, None, None, None]
    )
    bias = [[0.3], [-2.0], [0.1]]
    state = {"conv": torch.tensor(conv), "bias": torch.tensor(bias)[:, 0]}
    params = {"conv": nn.Parameter(torch.zeros(7, 2, 3, 3)), "bias": nn.Parameter(torch.zeros(3))}
    std = _agp_std("agp", state, nn.ParameterDict(params), 1.7, top_q=0.3, clip_norm=0.5)
    for name, rows in (("conv", conv.reshape(7, -1).tolist()), ("bias", bias)):
        protected = _hand_protected(rows, 0.3)  # conv: ceil(2.1) = 3 rows; bias: ceil(0.9) = 1
        expected = [0.0 if i in protected else 1.7 * 0.5 for i in range(len(rows))]
        torch.testing.assert_close(std[name], torch.tensor(expected, dtype=torch.float32))
    assert _hand_protected(conv.reshape(7, -1).tolist(), 0.3) == {1, 3, 6}


def test_agp_step_leaves_the_protected_channels_noise_free():
    """Through the real noisy step with a zero gradient: protected rows do not move at all,
    the others move by noise of std σ·C."""
    net = nn.Linear(400, 4, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([0.01, 1.0, 0.02, 0.03])[:, None] * torch.ones(4, 400))
    gsm = wrap(net, "hooks")
    before = net.weight.detach().clone()
    std = _agp_std("agp", {"weight": before}, gsm, 2.0, top_q=0.25, clip_norm=1.0)
    opt = torch.optim.SGD(gsm.parameters(), lr=1.0)
    zero = {"weight": torch.zeros(4, 400)}
    noisy_step(gsm, opt, zero, std, expected_batch=1.0, generator=torch.Generator().manual_seed(0))
    change = before - net.weight.detach()
    assert torch.equal(change[1], torch.zeros(400))  # the one protected row (largest norm)
    np.testing.assert_allclose(change[[0, 2, 3]].std(dim=1).numpy(), [2.0] * 3, rtol=0.15)


def test_agp_dp_gives_sigma_ref_to_the_top_channels_and_more_noise_elsewhere():
    weight = torch.tensor([[3.0, 0.0], [0.1, 0.1], [0.0, 2.0], [0.5, 0.0], [0.2, 0.2]])
    params = {"w": nn.Parameter(torch.zeros(5, 2))}
    std = _agp_std("agp-dp", {"w": weight}, nn.ParameterDict(params), 2.0, band=0.2, top_q=0.4,
                   clip_norm=0.5)  # fmt: skip
    expected = torch.tensor([1.0, 1.2, 1.0, 1.2, 1.2])  # top 2 of 5 by row norm: rows 0 and 2
    torch.testing.assert_close(std["w"], expected)
    assert float(std["w"].min()) == pytest.approx(2.0 * 0.5)  # accounted σ is the smallest
    assert set(trainable(wrap(nn.Linear(2, 1), "hooks"))) == {"weight", "bias"}
