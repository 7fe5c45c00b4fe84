"""White-box Dirac canaries in the DP-SGD engine: their per-sample gradients, their sampling, that
the engine clips them with the rule, that σ = 0 separates them perfectly for every clip rule,
and that the audit stays below the accountant's ε at the calibrated σ and exceeds it at σ/10."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from dpmed.privacy import accounting
from dpmed.privacy.audit.bound import best_audit
from dpmed.privacy.audit.dirac import DiracCanaries, flat_parameters
from dpmed.privacy.clipping import ClipRule, private_rules
from dpmed.privacy.dpsgd import (
    ScaledPrivacyEngine,
    clipped_grad_sum,
    noisy_step,
    opacus_clip_factors,
    trainable,
    wrap_per_sample,
)

# A bias-free linear classifier (1024 weights) on 16 Gaussian images: per-sample gradients
# spread over many coordinates, so the data barely touch any one canary's coordinate.
N, D, K, M, Q, DELTA = 16, 64, 16, 100, 0.5, 1e-5


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one thread is ~50× faster than several on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _setup(seed: int) -> tuple[torch.Generator, nn.Module, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Linear(D, K, bias=False)
    x = torch.randn(N, D, generator=generator)
    y = torch.randint(0, K, (N,), generator=generator)
    return generator, model, x, y


def _opacus_run(seed: int, rule: str, sigma: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores and inclusion of M canaries after `steps` DP-SGD steps of the seg front."""
    generator, model, x, y = _setup(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus' secure-RNG notice
        dp = ScaledPrivacyEngine(ClipRule(rule)).make_private_poisson(
            model,
            optimizer,
            TensorDataset(x, y),
            sample_rate=Q,
            noise_multiplier=sigma,
            grad_sample_mode="hooks",
            generator=generator,
        )
    params = dp.optimizer.params
    canaries = DiracCanaries.draw(params, M, 1.0, Q, generator)
    before = [p.detach().clone() for p in params]
    for _ in range(steps):
        xb, yb = next(iter(dp.loader))
        dp.optimizer.zero_grad()
        if len(yb) == 0:  # an empty Poisson batch: no data rows (as `DPSGD.step_empty`)
            for p in params:
                p.grad_sample = torch.zeros((0, *p.shape))
        else:
            dp.backward(F.cross_entropy(dp.module(xb), yb, reduction="none"))
        canaries.inject(params, canaries.step_members(generator))
        dp.optimizer.step()
    return canaries.scores(before, params), canaries.included.numpy()


def _functional_run(seed: int, sigma: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The same on the xcal front: flat clipping with Opacus' 1e-6, noise std σ·C."""
    generator, model, x, y = _setup(seed)
    gsm = wrap_per_sample(model, "hooks")
    optimizer = torch.optim.SGD(gsm.parameters(), lr=1.0)
    params = trainable(gsm)
    canaries = DiracCanaries.draw(list(params.values()), M, 1.0, Q, generator)
    before = [p.detach().clone() for p in params.values()]

    def factors(norms: torch.Tensor) -> torch.Tensor:
        return opacus_clip_factors(norms, 1.0)

    for _ in range(steps):
        batch = torch.nonzero(torch.rand(N, generator=generator) < Q)[:, 0]
        sums, _ = clipped_grad_sum(gsm, x[batch], y[batch], factors)
        extra = canaries.clipped_sums(params, canaries.step_members(generator), factors)
        sums = {name: sums[name] + extra[name] for name in sums}
        noisy_step(gsm, optimizer, sums, dict.fromkeys(sums, sigma), Q * N, generator)
    return canaries.scores(before, list(params.values())), canaries.included.numpy()


def test_grad_samples_are_diracs_of_norm_c():
    params = [torch.zeros(3, 4), torch.zeros(5)]
    canaries = DiracCanaries(torch.tensor([2, 13, 7]), torch.tensor([True] * 3), 0.5, 1.0)
    rows = canaries.grad_samples(params, torch.tensor([0, 1]))
    assert [r.shape for r in rows] == [(2, 3, 4), (2, 5)]
    flat = torch.cat([r.reshape(2, -1) for r in rows], dim=1)
    assert torch.equal(flat.norm(dim=1), torch.tensor([0.5, 0.5]))
    assert flat[0, 2] == 0.5 and flat[1, 13] == 0.5


def test_step_members_are_included_canaries_sampled_at_rate_q():
    generator = torch.Generator().manual_seed(0)
    canaries = DiracCanaries.draw([torch.zeros(500)], 200, 1.0, 0.3, generator)
    counts = torch.zeros(200)
    steps = 2000
    for _ in range(steps):
        counts[canaries.step_members(generator)] += 1
    assert counts[~canaries.included].sum() == 0
    rate = counts[canaries.included].sum() / (steps * canaries.included.sum())
    assert abs(rate - 0.3) < 5 * (0.3 * 0.7 / (steps * canaries.included.sum())) ** 0.5


@pytest.mark.parametrize("rule", ["flat", "nsgd"])
def test_engine_clips_injected_canaries_with_the_rule(rule):
    """With σ = 0, one step with injected canaries minus the same step without them moves the
    canary coordinates by exactly Σ s(C)·C·e_c / (q·N), as `clipped_sums` gives it."""
    deltas = []
    for inject in (False, True):
        generator, model, x, y = _setup(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dp = ScaledPrivacyEngine(ClipRule(rule)).make_private_poisson(
                model,
                torch.optim.SGD(model.parameters(), lr=1.0),
                TensorDataset(x, y),
                sample_rate=Q,
                noise_multiplier=0.0,
                grad_sample_mode="hooks",
            )
        params = dp.optimizer.params
        canaries = DiracCanaries.draw(params, 10, 1.0, 1.0, torch.Generator().manual_seed(1))
        members = canaries.step_members(torch.Generator().manual_seed(2))
        before = flat_parameters(params).double()
        dp.optimizer.zero_grad()
        dp.backward(F.cross_entropy(dp.module(x), y, reduction="none"))
        if inject:
            canaries.inject(params, members)
        dp.optimizer.step()
        deltas.append(before - flat_parameters(params).double())
    named = {f"p{i}": p for i, p in enumerate(params)}
    sums = canaries.clipped_sums(named, members, ClipRule(rule).factors)
    expected = flat_parameters(list(sums.values())).double() / (Q * N)
    assert len(members) > 0
    assert torch.allclose(deltas[1] - deltas[0], expected, atol=1e-6)


@pytest.mark.parametrize("rule", private_rules())
def test_without_noise_every_rule_separates_the_canaries(rule):
    scores, included = _opacus_run(0, rule, 0.0, 20)
    assert scores[included].min() > scores[~included].max()
    result = best_audit(scores, included, 0.95, DELTA)
    assert result.correct == result.guesses
    assert result.eps_lower > 2.5


def test_functional_front_without_noise_separates_the_canaries():
    scores, included = _functional_run(0, 0.0, 20)
    assert scores[included].min() > scores[~included].max()


@pytest.mark.parametrize("front", ["functional", "opacus-nsgd"])
def test_soundness_at_the_calibrated_sigma(front):
    """σ calibrated for ε = 1 over 10 steps (RDP accountant): the 95 % bound stays ≤ 1 in
    ≥ 95 of 100 seeded runs, on either engine front."""
    steps = 10
    sigma = accounting.noise_multiplier(1.0, DELTA, Q, steps)
    assert accounting.epsilon([(sigma, Q, steps)], DELTA) <= 1.0

    def run(seed: int) -> tuple[np.ndarray, np.ndarray]:
        if front == "functional":
            return _functional_run(seed, sigma, steps)
        return _opacus_run(seed, "nsgd", sigma, steps)

    bounds = [best_audit(*run(seed), 0.95, DELTA).eps_lower for seed in range(100)]
    assert sum(b <= 1.0 for b in bounds) >= 95


@pytest.mark.parametrize("seed", range(2))
def test_power_at_a_tenth_of_the_calibrated_sigma(seed):
    steps = 20
    sigma = accounting.noise_multiplier(1.0, DELTA, Q, steps) / 10
    result = best_audit(*_opacus_run(seed, "flat", sigma, steps), 0.95, DELTA)
    assert result.eps_lower > 1.0


def test_inject_needs_per_sample_gradients():
    param = nn.Parameter(torch.zeros(4))
    canaries = DiracCanaries(torch.tensor([1]), torch.tensor([True]), 1.0, 1.0)
    with pytest.raises(ValueError, match="per-sample gradients"):
        canaries.inject([param], torch.tensor([0]))
