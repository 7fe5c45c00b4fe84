"""The one-run ε lower bound: its binomial tail and δ term against brute-force sums, its closed
form for perfect guesses, its exact level on randomized response, and soundness and power on a
Gaussian mechanism whose ε is known exactly (one canary per output coordinate)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import binom

from dpmed.privacy.audit.bound import (
    audit_from_scores,
    best_audit,
    binomial_tail,
    eps_lower_bound,
    guess_grid,
    p_value,
)
from dpmed.privacy.mechanisms import analytic_sigma


def _exact_tail(trials: int, successes: int, p: float) -> float:
    """P[Binomial(trials, p) ≥ successes] summed term by term in exact rationals."""
    q = Fraction(p)
    terms = (
        math.comb(trials, k) * q**k * (1 - q) ** (trials - k)
        for k in range(max(successes, 0), trials + 1)
    )
    return float(sum(terms, Fraction(0)))


@pytest.mark.parametrize(
    ("trials", "successes", "p"),
    [(1, 1, 0.5), (10, 7, 0.73), (50, 0, 0.2), (50, 51, 0.2), (120, 100, 0.881), (200, 3, 0.01)],
)
def test_binomial_tail_matches_scipy_and_a_brute_force_sum(trials, successes, p):
    got = binomial_tail(trials, successes, p)
    assert got == pytest.approx(_exact_tail(trials, successes, p), rel=1e-10, abs=1e-300)
    assert got == pytest.approx(1 - binom.cdf(successes - 1, trials, p), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize(
    ("m", "r", "v", "eps", "delta"),
    [(100, 40, 30, 0.7, 1e-3), (1000, 80, 70, 1.5, 1e-5), (50, 20, 20, 0.0, 1e-2)],
)
def test_p_value_is_the_tail_plus_the_delta_term(m, r, v, eps, delta):
    """f(v) + 2mδ·max_i (f(v−i) − f(v))/i with every f an exact sum."""
    q = 1 / (1 + math.exp(-eps))
    f = [_exact_tail(r, k, q) for k in range(v + 1)]
    slope = max((f[v - i] - f[v]) / i for i in range(1, v + 1))
    assert p_value(m, r, v, eps, delta) == pytest.approx(min(1.0, f[v] + 2 * m * delta * slope))
    assert p_value(m, r, v, eps, 0.0) == pytest.approx(f[v])


@pytest.mark.parametrize("guesses", [10, 100, 1000])
def test_perfect_guesses_give_the_closed_form(guesses):
    """All r guesses right: q^r = β at the bound, so ε = log(q/(1−q)) with q = β^(1/r)
    (5.81 for r = 1000 at 95 %)."""
    q = 0.05 ** (1 / guesses)
    expected = math.log(q / (1 - q))
    assert eps_lower_bound(guesses, guesses, 0.95) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("m", "r", "v", "delta"), [(500, 100, 80, 0.0), (500, 100, 80, 1e-5), (1000, 400, 250, 1e-6)]
)
def test_bound_is_the_largest_rejected_eps(m, r, v, delta):
    eps = eps_lower_bound(r, v, 0.95, delta, canaries=m)
    assert eps > 0
    assert p_value(m, r, v, eps, delta) < 0.05
    assert p_value(m, r, v, eps + 1e-9, delta) >= 0.05


def test_delta_weakens_the_bound():
    plain = eps_lower_bound(200, 180, 0.95)
    assert eps_lower_bound(200, 180, 0.95, 1e-4, canaries=1000) < plain
    assert eps_lower_bound(200, 180, 0.95, 1e-9, canaries=1000) == pytest.approx(plain, rel=1e-3)


@pytest.mark.parametrize("guesses", [10, 40])
def test_no_evidence_gives_zero(guesses):
    assert eps_lower_bound(guesses, guesses // 2, 0.95) == 0.0
    assert eps_lower_bound(guesses, 0, 0.95) == 0.0


@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
def test_exact_level_on_randomized_response(eps):
    """ε-DP randomized response on r canaries makes W ~ Binomial(r, e^ε/(1+e^ε)) exactly, the
    extreme case of the theorem: P[bound > ε] must be ≤ β, and near β since the test is tight."""
    r, level = 200, 0.05
    pmf = binom.pmf(np.arange(r + 1), r, expit(eps))
    exceeds = np.array([eps_lower_bound(r, v, 1 - level) > eps for v in range(r + 1)])
    size = float(pmf[exceeds].sum())
    assert level / 2 < size <= level


def test_audit_from_scores_counts_top_and_bottom_guesses():
    scores = [5.0, 4.0, 3.0, 3.0, 1.0, 0.0]
    included = [True, False, True, False, False, True]
    result = audit_from_scores(scores, included, k_pos=3, k_neg=2)
    # "in": canaries 0, 1, 2 (the tie 2/3 goes to the lower index) → 2 right;
    # "out": canaries 4, 5 → 1 right.
    assert (result.canaries, result.guesses, result.correct) == (6, 5, 3)
    assert result.eps_lower == eps_lower_bound(5, 3, 0.95, canaries=6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(k_pos=4, k_neg=3), "k_pos \\+ k_neg"),
        (dict(k_pos=1, k_neg=1, confidence=1.0), "confidence"),
    ],
)
def test_audit_from_scores_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        audit_from_scores(np.arange(6.0), np.ones(6, dtype=bool), **kwargs)


def test_delta_needs_the_canary_count():
    with pytest.raises(ValueError, match="canaries"):
        eps_lower_bound(10, 10, 0.95, 1e-5)


def test_best_audit_spends_the_level_across_the_grid():
    rng = np.random.default_rng(3)
    included = rng.random(400) < 0.5
    scores = included + rng.normal(0, 0.5, 400)
    grid = guess_grid(400)
    assert grid == ((4, 4), (8, 8), (20, 20), (40, 40), (80, 80), (160, 160))
    best = best_audit(scores, included, 0.95, 1e-5)
    each = [audit_from_scores(scores, included, kp, kn, 1 - 0.05 / 6, 1e-5) for kp, kn in grid]
    assert best.eps_lower == max(r.eps_lower for r in each)
    assert best.confidence == 0.95
    alone = audit_from_scores(scores, included, best.k_pos, best.k_neg, 0.95, 1e-5)
    assert best.eps_lower < alone.eps_lower


def _gaussian_audit(seed: int, eps: float, delta: float, divisor: float, m: int = 1000):
    """One run of the Gaussian mechanism y_j = S_j + N(0, σ²) (one canary per coordinate, so
    (ε, δ)-DP per canary at the analytic σ), σ divided by `divisor`, audited by `best_audit`."""
    rng = np.random.default_rng(seed)
    sigma = analytic_sigma(1.0, eps, delta) / divisor
    included = rng.random(m) < 0.5
    scores = included + (rng.normal(0.0, sigma, m) if sigma > 0 else 0.0)
    return best_audit(scores, included, 0.95, delta)


def test_soundness_on_a_gaussian_mechanism():
    """At the true ε = 2 (δ = 1e-5), the 95 % bound stays ≤ ε in ≥ 95 of 100 seeded runs."""
    bounds = [_gaussian_audit(seed, 2.0, 1e-5, 1.0).eps_lower for seed in range(100)]
    assert sum(b <= 2.0 for b in bounds) >= 95


def test_power_without_noise():
    result = _gaussian_audit(0, 1.0, 1e-5, math.inf)
    assert result.correct == result.guesses
    assert result.eps_lower >= 3


@pytest.mark.parametrize("seed", range(3))
def test_power_on_a_mis_noised_mechanism(seed):
    """σ calibrated for ε = 1, then divided by 10: the audit proves ε > 1."""
    assert _gaussian_audit(seed, 1.0, 1e-5, 10.0).eps_lower > 1.0
