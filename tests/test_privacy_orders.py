"""The Rényi order grid and the calibration: every ε of the paper config calibrates, the σ is
the smallest that meets the target, the grid is dense and wide enough, and `compute_rdp` matches
a brute-force integral (also at orders where Opacus' `compute_rdp` overflows)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.analysis import rdp as opacus_rdp
from scipy import integrate

from dpmed.privacy import accounting, adaptive

# (study, ε, δ, q, steps), derived as in bench/calibration.py with small representative sizes:
# xcal: B = 64, 30 rounds × 1 local epoch, q = 1/ceil(n/B), T = 30·ceil(n/B); the xcal method
# splits (ε, δ) into a signal share 0.1·(ε, δ) and a gradient share 0.9·(ε, δ).
# n = 1195 (BloodMNIST over 10 clients): q = 1/19, T = 570; n = 94 (PneumoniaMNIST over 50
# clients): q = 1/2, T = 60; n = 11959 (centralized BloodMNIST): q = 1/187, T = 5610.
# seg: ε = 200, δ = 1e-5, q = B/N, T = epochs·int(N/B): UMN (B 8, N 425, 50 epochs), COVID-CT
# (B 24, N 60, 100 epochs). fets: server-side Gaussian, q = 1, one step, ε ∈ {1, 10}.
RDP_CELLS = [
    ("xcal", 0.05, 1e-5, 1 / 19, 570),
    ("xcal", 0.005, 1e-6, 1 / 19, 570),
    ("xcal", 0.045, 9e-6, 1 / 19, 570),
    ("xcal", 0.5, 1e-5, 1 / 19, 570),
    ("xcal", 5.0, 1e-6, 1 / 19, 570),
    ("xcal", 45.0, 9e-6, 1 / 19, 570),
    ("xcal", 50.0, 1e-5, 1 / 19, 570),
    ("xcal", 0.05, 1e-6, 1 / 2, 60),
    ("xcal", 0.5, 1e-5, 1 / 187, 5610),
    ("seg", 200.0, 1e-5, 8 / 425, 2650),
    ("seg", 200.0, 1e-5, 24 / 60, 200),
    ("fets", 1.0, 1e-5, 1.0, 1),
    ("fets", 10.0, 1e-5, 1.0, 1),
]
# PRV evaluations cost ~0.1–0.5 s each: fewer cells, seg with fewer steps.
PRV_CELLS = [
    ("xcal", 0.005, 1e-6, 1 / 8, 240),
    ("xcal", 0.045, 9e-6, 1 / 8, 240),
    ("seg", 200.0, 1e-5, 8 / 425, 500),
    ("fets", 1.0, 1e-5, 1.0, 1),
    ("fets", 10.0, 1e-5, 1.0, 1),
]


def _ids(cells):
    return [f"{s}-eps{e:g}-delta{d:g}-q{q:.3g}-T{t}" for s, e, d, q, t in cells]


CALIBRATION_CELLS = [("rdp", *cell) for cell in RDP_CELLS] + [("prv", *c) for c in PRV_CELLS]


@pytest.mark.parametrize(
    ("accountant", "study", "eps", "delta", "q", "steps"),
    CALIBRATION_CELLS,
    ids=[f"{a}-{i}" for a, i in zip([c[0] for c in CALIBRATION_CELLS],
                                      _ids(RDP_CELLS) + _ids(PRV_CELLS), strict=True)],
)  # fmt: skip
def test_every_paper_epsilon_calibrates_to_the_smallest_sigma(
    accountant, study, eps, delta, q, steps
):
    sigma = accounting.noise_multiplier(eps, delta, q, steps, accountant)
    assert accounting.epsilon([(sigma, q, steps)], delta, accountant) <= eps
    assert accounting.epsilon([(sigma * (1 - 1e-3), q, steps)], delta, accountant) > eps


def test_calibration_is_cached():
    first = accounting.noise_multiplier(0.7, 1e-5, 0.03, 333)
    assert accounting.noise_multiplier(0.7, 1e-5, 0.03, 333) == first
    assert accounting._calibrate_rdp.cache_info().hits >= 1


def test_the_grid_extends_opacus_defaults_on_both_sides():
    orders = accounting.ORDERS
    assert adaptive.ORDERS is orders
    assert list(orders) == sorted(set(orders))
    assert orders[0] == 1.01 and orders[-1] >= 1e4
    assert set(RDPAccountant.DEFAULT_ALPHAS) <= set(orders)
    assert all(a == round(a) for a in orders if a > 11)  # large orders: integer formula


def _rdp_eps(history, delta, orders):
    rdp = sum(
        accounting.compute_rdp(q=q, noise_multiplier=s, steps=n, orders=orders)
        for s, q, n in history
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)


def _ten_times_denser(orders):
    """Nine orders between each pair (geometric in α − 1), rounded to integers above 11."""
    dense = set(orders)
    for a, b in zip(orders, orders[1:], strict=False):
        for k in range(1, 10):
            x = 1 + (a - 1) * ((b - 1) / (a - 1)) ** (k / 10)
            dense.add(float(round(x)) if a >= 11 else round(x, 6))
    return sorted(dense)


@pytest.mark.parametrize(("study", "eps", "delta", "q", "steps"), RDP_CELLS, ids=_ids(RDP_CELLS))
def test_the_grid_is_within_one_percent_of_a_ten_times_denser_grid(study, eps, delta, q, steps):
    sigma = accounting.noise_multiplier(eps, delta, q, steps)
    history = [(sigma, q, steps)]
    on_grid, alpha = _rdp_eps(history, delta, list(accounting.ORDERS))
    dense, _ = _rdp_eps(history, delta, _ten_times_denser(accounting.ORDERS))
    assert dense <= on_grid <= 1.01 * dense
    assert accounting.ORDERS[0] < alpha < accounting.ORDERS[-1]  # optimum inside the grid


@pytest.mark.parametrize(
    "history",
    [[(1.1, 0.01, 300)], [(0.31, 8 / 425, 2650)], [(0.18, 0.05, 300)], [(3.0, 1.0, 5)],
     [(1.0, 0.05, 3), (1.4, 0.05, 2)], [(2.0, 1 / 63, 1890)]],
)  # fmt: skip
def test_the_grid_is_never_looser_than_opacus_defaults(history):
    opacus = RDPAccountant()
    opacus.history = list(history)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = opacus.get_epsilon(1e-5)
    assert accounting.epsilon(history, 1e-5) <= old * (1 + 1e-9)


def _log_a_by_integration(q: float, sigma: float, alpha: float) -> float:
    """log E_{z~N(0,σ²)}[((1 − q) + q·exp((2z − 1)/(2σ²)))^α] by adaptive quadrature of the
    log-scaled integrand (its modes are near z = 0 and z = α)."""

    def log_f(z):
        ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma**2))
        return -(z**2) / (2 * sigma**2) - math.log(sigma * math.sqrt(2 * math.pi)) + alpha * ratio

    low, high = -40 * sigma, alpha + 40 * sigma
    peak = float(np.max(log_f(np.linspace(low, high, 200_001))))
    value, _ = integrate.quad(
        lambda z: math.exp(log_f(z) - peak), low, high, points=[0.0, alpha], limit=1000,
        epsabs=0.0, epsrel=1e-12,
    )  # fmt: skip
    return peak + math.log(value)


@pytest.mark.parametrize(
    ("q", "sigma", "alpha"),
    [(0.01, 1.0, 2.0), (0.05, 0.8, 10.0), (0.3, 0.5, 64.0), (0.25, 21.1, 32.0),
     (0.0526, 1.44, 4.9), (0.0188, 0.31, 1.16), (0.12, 0.36, 1.05), (0.5, 30.0, 1.05),
     (0.0526, 89.8, 252.0), (0.0526, 806.0, 2278.0), (0.01, 2.0, 5000.0), (0.125, 1242.0, 10000.0)],
)  # fmt: skip
def test_compute_rdp_matches_a_brute_force_integral(q, sigma, alpha):
    rdp = accounting.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=[alpha])[0]
    assert rdp == pytest.approx(_log_a_by_integration(q, sigma, alpha) / (alpha - 1), rel=1e-6)


def test_opacus_compute_rdp_breaks_at_large_orders_where_ours_does_not():
    """C(α, α/2) overflows a float beyond α ≈ 1030: Opacus' ρ is nan there (and its
    `get_privacy_spent` silently skips nan orders); ε = 0.005 needs α ≈ 2300."""
    ours = accounting.compute_rdp(q=0.0526, noise_multiplier=806.0, steps=570, orders=[2278.0])
    theirs = opacus_rdp.compute_rdp(q=0.0526, noise_multiplier=806.0, steps=570, orders=[2278.0])
    assert not np.isfinite(theirs[0]) and np.isfinite(ours[0])


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.1), (0.1, 0.8), (0.0188, 0.31), (0.5, 3.0)])
def test_compute_rdp_equals_opacus_at_opacus_orders(q, sigma):
    orders = RDPAccountant.DEFAULT_ALPHAS
    ours = accounting.compute_rdp(q=q, noise_multiplier=sigma, steps=7, orders=orders)
    theirs = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=7, orders=orders)
    np.testing.assert_allclose(ours, theirs, rtol=1e-8)


@pytest.mark.parametrize("history", [[(1.0, 0.05, 100)], [(1.0, 0.05, 30), (1.3, 0.05, 50)]])
def test_prv_epsilon_equals_opacus_prv_accountant_at_the_same_eps_error(history):
    """Same eps_error (1e-3 of the RDP ε, no grid cap here): the padded domain and the RDP
    bound at `ORDERS` leave Opacus' ε unchanged."""
    opacus = PRVAccountant()
    opacus.history = list(history)
    eps_error = accounting.PRV_RELATIVE_ERROR * accounting.epsilon(history, 1e-5, "rdp")
    expected = opacus.get_epsilon(1e-5, eps_error=eps_error)
    assert accounting.epsilon(history, 1e-5, "prv") == pytest.approx(expected, rel=1e-6)
    assert accounting.epsilon(history, 1e-5, "prv") <= accounting.epsilon(history, 1e-5, "rdp")


@pytest.mark.parametrize(
    ("eps", "delta", "q", "steps", "named"),
    [(0.0, 1e-5, 0.1, 10, "epsilon = 0.0"), (-1.0, 1e-5, 0.1, 10, "epsilon = -1.0"),
     (math.inf, 1e-5, 0.1, 10, "epsilon = inf"), (1.0, 1.0, 0.1, 10, "delta = 1.0"),
     (1.0, 0.0, 0.1, 10, "delta = 0.0"), (1.0, 1e-5, 0.0, 10, "q = 0.0"),
     (1.0, 1e-5, 1.5, 10, "q = 1.5"), (1.0, 1e-5, 0.1, 0, "steps = 0"),
     (1e-5, 1e-6, 0.1, 10, "epsilon = 1e-05 at delta = 1e-06")],
)  # fmt: skip
def test_unreachable_targets_raise_naming_the_values(eps, delta, q, steps, named):
    for accountant in accounting.ACCOUNTANTS:
        with pytest.raises(ValueError, match=named):
            accounting.noise_multiplier(eps, delta, q, steps, accountant)
