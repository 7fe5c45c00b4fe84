"""Gaussian mechanism calibrations: classic formula, analytic Gaussian, RDP."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from dpmed.privacy import accounting
from dpmed.privacy.mechanisms import (
    analytic_sigma,
    calibrate,
    classic_sigma,
    gaussian_delta,
    rdp_epsilon,
    rdp_sigma,
)


def _delta_by_integration(z: float, eps: float) -> float:
    """δ(ε) = E_{x~N(0,σ²)}[(1 − e^{ε − L(x)})_+] with the privacy loss L of N(0,σ²) vs
    N(Δ,σ²), by numerical integration (independent of the closed form)."""
    mu = 1.0 / z  # Δ/σ with Δ = 1

    def integrand(x: float) -> float:
        loss = mu * x - mu**2 / 2  # log p_{N(mu,1)}(x) - log p_{N(0,1)}(x), x ~ N(mu, 1)
        return max(0.0, 1.0 - math.exp(eps - loss)) * stats.norm.pdf(x, loc=mu)

    value, _ = integrate.quad(integrand, eps / mu + mu / 2, mu + 40, limit=200)
    return value


def test_classic_formula():
    assert classic_sigma(2.0, 0.5, 1e-5) == pytest.approx(
        2.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5
    )


@pytest.mark.parametrize(("eps", "delta"), [(0.5, 1e-5), (1.0, 1e-5), (10.0, 1e-5), (3.0, 1e-3)])
def test_analytic_gaussian_hits_delta_exactly(eps, delta):
    sigma = analytic_sigma(1.0, eps, delta)
    assert gaussian_delta(sigma, eps) <= delta
    assert gaussian_delta(sigma, eps) == pytest.approx(delta, rel=1e-6)
    assert _delta_by_integration(sigma, eps) == pytest.approx(delta, rel=1e-4)
    assert analytic_sigma(3.0, eps, delta) == pytest.approx(3.0 * sigma)


def test_analytic_is_tighter_than_classic_where_classic_is_valid_and_classic_fails_at_eps10():
    for eps in (0.1, 0.5, 1.0):
        assert analytic_sigma(1.0, eps, 1e-5) < classic_sigma(1.0, eps, 1e-5)
    # At eps0 = 10 the classic sigma is below the exact requirement: it under-noises.
    classic = classic_sigma(1.0, 10.0, 1e-5)
    assert classic < analytic_sigma(1.0, 10.0, 1e-5)
    assert gaussian_delta(classic, 10.0) > 1e-5


def test_rdp_calibration_and_composition():
    z = rdp_sigma(1.0, 2.0, 1e-5)
    assert accounting.epsilon([(z, 1.0, 1)], 1e-5) <= 2.0 + 1e-9
    assert accounting.epsilon([(z * 0.95, 1.0, 1)], 1e-5) > 2.0 - 0.02
    # rdp_epsilon composes T mechanisms: closed form min over orders of T·a/(2z²) + conversion.
    assert rdp_epsilon(z, 5, 1e-5) == pytest.approx(accounting.epsilon([(z, 1.0, 5)], 1e-5))
    assert rdp_epsilon(z, 0, 1e-5) == 0.0
    assert calibrate("analytic", 1.0, 1.0, 1e-5) == analytic_sigma(1.0, 1.0, 1e-5)


def test_bad_arguments_fail():
    for args in ((1.0, 0.0, 1e-5), (1.0, 1.0, 0.0), (-1.0, 1.0, 1e-5)):
        with pytest.raises(ValueError):
            classic_sigma(*args)
    with pytest.raises(ValueError, match="unknown calibration"):
        calibrate("laplace", 1.0, 1.0, 1e-5)


def test_analytic_sigma_noise_gives_stated_std():
    sigma = analytic_sigma(2.0, 1.0, 1e-5)
    draws = np.random.default_rng(0).standard_normal(400_000) * sigma
    assert draws.std() == pytest.approx(sigma, rel=0.01)
