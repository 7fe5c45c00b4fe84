"""ε of a sequence of (Poisson-subsampled) Gaussian mechanisms, and the σ that meets a target ε.

A history is a list of `(noise_multiplier, sample_rate, steps)` triples, Opacus' own format: a
run whose σ changes over time (XCal-FL) lists one triple per stretch of constant σ; a mechanism
without subsampling (server-side DP in FeTS) uses sample_rate 1. The noise multiplier is the
noise std divided by the L2 sensitivity.

Two accountants:

- "rdp": Rényi DP of the sampled Gaussian mechanism (Mironov, Talwar & Zhang 2019) at the
  orders `ORDERS`, composed by adding RDP and converted to (ε, δ) by Balle et al. 2020, Thm 21
  (Opacus' `get_privacy_spent`). `compute_rdp` here gives Opacus' values at Opacus' orders but
  is vectorised and exact at large integer orders, where Opacus' binomial coefficients
  overflow (ρ = nan beyond α ≈ 1030, orders its conversion then skips) and its Python loops
  take seconds.
- "prv": the numerical composition of privacy loss random variables (Gopi, Lee & Wutschitz
  2021) with Opacus' discretisation and composition; only its accuracy (eps_error) and grid
  length are chosen here, for speed (`prv_epsilon`).

`noise_multiplier` returns the smallest σ with ε(σ) ≤ target under either accountant, to a
relative precision in σ of `SIGMA_RTOL[accountant]`, and caches it per (ε, δ, q, steps,
accountant).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from scipy.fft import next_fast_len
from scipy.special import gammaln, log_ndtr

# Opacus is imported where ε is computed: importing it takes about 2 s (it pulls in
# torch.distributed and scipy.stats), which every non-private job would pay for nothing.
if TYPE_CHECKING:
    from opacus.accountants.analysis.prv import Domain

History = Sequence[tuple[float, float, int]]
ACCOUNTANTS = ("rdp", "prv")


def _orders() -> tuple[float, ...]:
    """1 + 0.01·1.1^k up to 2 (α − 1 geometric: large ε puts the optimum near 1, e.g. 1.16
    for seg at ε = 200), Opacus' defaults 1.1 … 10.9 and 12 … 63 (so ε is never looser than
    Opacus'), 11, then integers growing by 10 % up to 10^4 (tiny ε puts it far out: 2278 for
    ε = 0.005 at δ = 1e-6). Adjacent orders differ by about 10 % or less in α − 1, which keeps
    ε within 0.2 % of that of a 10× denser grid on the paper's cells."""
    near_one = {round(1 + 0.01 * 1.1**k, 4) for k in range(49)}
    tenths = {round(1 + k / 10, 1) for k in range(1, 100)}
    integers = set(range(11, 64))
    alpha = 64.0
    while alpha <= 1e4:
        integers.add(round(alpha))
        alpha *= 1.1
    integers.add(10_000)
    return tuple(sorted(float(a) for a in near_one | tenths | integers))


ORDERS: tuple[float, ...] = _orders()
SIGMA_RTOL = {"rdp": 1e-6, "prv": 5e-4}
SIGMA_MAX = 1e7
# PRV accuracy: eps_error = 1e-3 · (the RDP ε of the same history), unless that needs more than
# 2^20 grid points, then the eps_error that 2^20 points give (Opacus' fixed default of 0.01 is
# 5e-5 of ε at ε = 200, ~10^7 points and > 10 s, and 200 % of ε at ε = 0.005).
PRV_RELATIVE_ERROR = 1e-3
PRV_MAX_POINTS = 2**20


def compute_rdp(
    *, q: float, noise_multiplier: float, steps: int, orders: Sequence[float] | float
) -> np.ndarray:
    """RDP ρ(α) at `orders` of `steps` Poisson-subsampled Gaussian mechanisms (rate q, noise
    multiplier σ): ρ(α) = log A_α / (α − 1), A_α = E_{z~N(0,σ²)}[(1 − q + q e^{(2z−1)/2σ²})^α]
    (Mironov, Talwar & Zhang 2019, Sec. 3.3), exact binomial sum at integer α ≥ 2 and their
    series at fractional α (as Opacus' `compute_rdp`, same keywords)."""
    if not 0 <= q <= 1:
        raise ValueError(f"sample rate must be in [0, 1], got {q}")
    key = tuple(float(a) for a in np.atleast_1d(orders))
    if min(key) <= 1:
        raise ValueError(f"RDP orders must be > 1, got {min(key)}")
    return _rdp_one_step(float(q), float(noise_multiplier), key) * steps


@functools.lru_cache(maxsize=4096)
def _rdp_one_step(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    alphas = np.asarray(orders)
    if q == 0:
        rdp = np.zeros(len(alphas))
    elif sigma == 0:
        rdp = np.full(len(alphas), np.inf)
    elif q == 1:
        rdp = alphas / (2 * sigma**2)
    else:
        log_a = np.empty(len(alphas))
        whole = (alphas == np.round(alphas)) & (alphas >= 2)
        if whole.any():
            log_a[whole] = _log_a_int(q, sigma, tuple(int(a) for a in alphas[whole]))
        if not whole.all():
            log_a[~whole] = _log_a_frac(q, sigma, alphas[~whole])
        rdp = log_a / (alphas - 1)
    rdp.flags.writeable = False
    return rdp


@functools.lru_cache(maxsize=16)
def _binomial_table(orders: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Flattened over every integer order α and i = 2 … α: log C(α, i), i − 2 and α − i (as
    indices), and the segment starts and lengths."""
    alphas = np.asarray(orders)
    lengths = alphas - 1
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    alpha = np.repeat(alphas, lengths)
    i = np.arange(lengths.sum()) - np.repeat(starts, lengths) + 2
    log_binom = gammaln(alpha + 1.0) - gammaln(i + 1.0) - gammaln(alpha - i + 1.0)
    return log_binom, i - 2, alpha - i, starts, lengths


def _log_a_int(q: float, sigma: float, orders: tuple[int, ...]) -> np.ndarray:
    """log A_α at integer α: A_α = Σ_i C(α,i) q^i (1−q)^{α−i} e^{(i²−i)/2σ²}. The binomial
    weights sum to 1, so A_α = 1 + Σ_{i≥2} C(α,i) q^i (1−q)^{α−i} (e^{(i²−i)/2σ²} − 1): summed
    in log space (log-gamma coefficients), this is exact for tiny A_α − 1 and any α. The
    factors that depend on i or α − i alone are computed once per value k = 0 … max α and
    gathered (the orders share them: 10^4 values instead of 10^5 terms)."""
    log_binom, i_from_2, rest, starts, lengths = _binomial_table(orders)
    k = np.arange(max(orders) + 1, dtype=float)
    i = k[2:]
    x = (i * i - i) / (2 * sigma**2)
    log_expm1 = np.where(
        x < 1, np.log(np.expm1(np.minimum(x, 1.0))), x + np.log1p(-np.exp(-np.maximum(x, 1.0)))
    )
    terms = (
        log_binom + (i * math.log(q))[i_from_2] + (k * math.log1p(-q))[rest] + log_expm1[i_from_2]
    )
    peak = np.maximum.reduceat(terms, starts)
    total = np.add.reduceat(np.exp(terms - np.repeat(peak, lengths)), starts)
    return np.logaddexp(0.0, peak + np.log(total))


def _log_a_frac(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_α at fractional α by the two-sided series of Mironov et al. 2019 (Sec. 3.3), term
    for term as Opacus' `_compute_log_a_for_frac_alpha` (which stops at the first i where both
    terms are below e^-30), vectorised over α and i in growing chunks; log|C(α, i)| and its
    sign by the recursion C(α, i+1) = C(α, i)·(α − i)/(i + 1)."""
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    log_q, log_1q = math.log(q), math.log1p(-q)
    peak = np.full((2, len(alphas)), -np.inf)
    total = np.zeros((2, len(alphas)))
    log_coef0, negative0 = np.zeros(len(alphas)), np.zeros(len(alphas), dtype=int)
    active = np.arange(len(alphas))
    start, chunk = 0, 64
    while active.size:
        a = alphas[active][:, None]
        i = np.arange(start, start + chunk, dtype=float)[None, :]
        j = a - i
        step = np.log(np.abs(j)) - np.log(i + 1)
        log_coef = log_coef0[active][:, None] + np.cumsum(step, axis=1) - step
        negative = negative0[active][:, None] + np.cumsum(j < 0, axis=1) - (j < 0)
        sign = 1 - 2 * (negative % 2)
        s0 = log_coef + i * log_q + j * log_1q + (i * i - i) / (2 * sigma**2)
        s0 = s0 + log_ndtr((z0 - i) / sigma)
        s1 = log_coef + j * log_q + i * log_1q + (j * j - j) / (2 * sigma**2)
        s1 = s1 + log_ndtr((j - z0) / sigma)
        small = np.maximum(s0, s1) < -30
        stop = np.where(small.any(axis=1), small.argmax(axis=1), chunk)
        counted = np.arange(chunk)[None, :] <= stop[:, None]
        for side, terms in enumerate((s0, s1)):
            terms = np.where(counted, terms, -np.inf)
            new_peak = np.maximum(peak[side, active], terms.max(axis=1))
            scaled = (sign * np.exp(terms - new_peak[:, None])).sum(axis=1)
            total[side, active] = total[side, active] * np.exp(peak[side, active] - new_peak)
            total[side, active] += scaled
            peak[side, active] = new_peak
        log_coef0[active] = log_coef[:, -1] + step[:, -1]
        negative0[active] = negative[:, -1] + (j[:, -1] < 0)
        active = active[stop >= chunk]
        start, chunk = start + chunk, 2 * chunk
    return np.logaddexp(peak[0] + np.log(total[0]), peak[1] + np.log(total[1]))


def _conversion(orders: np.ndarray, delta: float) -> np.ndarray:
    """c(α, δ) with ε = ρ(α) + c(α, δ) (Balle et al. 2020, Thm 21)."""
    return np.log((orders - 1) / orders) - (np.log(delta) + np.log(orders)) / (orders - 1)


def _rdp_to_eps(rdp: np.ndarray, orders: np.ndarray, delta: float) -> float:
    """min_α ρ(α) + c(α, δ), operation for operation as Opacus' `get_privacy_spent` (so the
    calibration decides ε ≤ target on the very numbers `epsilon` reports), without its
    warnings about extreme orders (trial σ hit them)."""
    eps = rdp - (np.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)
    return float(np.nanmin(eps))


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got delta = {delta}")


def epsilon(history: History, delta: float, accountant: str = "rdp") -> float:
    """ε at `delta` after the mechanisms in `history` (0 for an empty history)."""
    _check_accountant(accountant)
    _check_delta(delta)
    if not history:
        return 0.0
    if accountant == "prv":
        return prv_epsilon(history, delta)
    from opacus.accountants.analysis.rdp import get_privacy_spent

    rdp = sum(
        (compute_rdp(q=q, noise_multiplier=s, steps=n, orders=ORDERS) for s, q, n in history),
        np.zeros(len(ORDERS)),
    )
    return float(get_privacy_spent(orders=list(ORDERS), rdp=list(rdp), delta=delta)[0])


def prv_epsilon(history: History, delta: float) -> float:
    """ε at `delta` of `history` by Opacus' PRV accountant (Gopi et al. 2021): Opacus' domain
    (its Remark 5.6 bound plus 3) and mesh for eps_error = `PRV_RELATIVE_ERROR` · ε_rdp, capped
    at `PRV_MAX_POINTS` grid points, padded to an FFT-friendly length (a wider domain only
    shrinks the truncation error); returns the upper bound, estimate + eps_error."""
    return _prv_epsilon(tuple((float(s), float(q), int(n)) for s, q, n in history), delta)


@functools.lru_cache(maxsize=256)
def _prv_epsilon(history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    from opacus.accountants.analysis.prv import (
        PoissonSubsampledGaussianPRV,
        TruncatedPrivacyRandomVariable,
        compose_heterogeneous,
        discretize,
    )

    delta_error = delta / 1000  # Opacus' default
    counts = [n for _, _, n in history]
    root = math.sqrt(sum(counts) * math.log(12 / delta_error) / 2)  # mesh = eps_error / root
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # log(1 − q) at q = 1; extreme orders at trial σ
        bound = _prv_loss_bound(history, delta_error)
        eps_error = max(
            PRV_RELATIVE_ERROR * epsilon(history, delta, "rdp"),
            2 * (bound + 3) * root / PRV_MAX_POINTS,
        )
        domain = _fft_domain(max(bound, eps_error) + 3, eps_error / root)
        dprvs = [
            discretize(TruncatedPrivacyRandomVariable(prv, domain.t_min, domain.t_max), domain)
            for prv in (PoissonSubsampledGaussianPRV(q, s) for s, q, _ in history)
        ]
        composed = compose_heterogeneous(dprvs=dprvs, num_self_compositions=counts)
        return float(composed.compute_epsilon(delta, delta_error, eps_error)[2])


def _prv_loss_bound(history: tuple[tuple[float, float, int], ...], delta_error: float) -> float:
    """Opacus' `compute_safe_domain_size` bound on the privacy loss (Gopi et al. 2021, Remark
    5.6: RDP ε of the whole history at δ_err/4 and of each single step at δ_err/8T), with the
    RDP ε at `ORDERS` (a valid RDP bound at any orders; Opacus' own takes seconds at q = 0.5)."""
    total = sum(n for _, _, n in history)
    single = (epsilon([(s, q, 1)], delta_error / (8 * total)) for s, q, _ in history)
    return max(epsilon(history, delta_error / 4), *single)


def _fft_domain(half: float, mesh: float) -> Domain:
    """Opacus' aligned domain [-half, half] at `mesh`, widened by equal amounts on both sides
    to an even length whose half is 2·3·5-smooth (pocketfft is 10× slower on other lengths)."""
    from opacus.accountants.analysis.prv import Domain

    base = Domain.create_aligned(-half, half, mesh)
    size = 2 * next_fast_len(base.size // 2, real=True)
    pad = (size - base.size) // 2
    return Domain(base.t_min - pad * base.dt, base.t_max + pad * base.dt, size)


def noise_multiplier(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> float:
    """Smallest noise multiplier σ, to a relative precision of `SIGMA_RTOL[accountant]`, with
    ε(σ) ≤ target after `steps` mechanisms at `sample_rate`; ValueError if no σ reaches it."""
    _check_accountant(accountant)
    _check_delta(delta)
    if not (0 < target_epsilon < math.inf):
        raise ValueError(f"target epsilon must be finite and > 0, got epsilon = {target_epsilon}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must be in (0, 1], got q = {sample_rate}")
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer, got steps = {steps}")
    args = (float(target_epsilon), float(delta), float(sample_rate), int(steps))
    return _calibrate_prv(*args) if accountant == "prv" else _calibrate_rdp(*args)


@functools.lru_cache(maxsize=1024)
def _calibrate_rdp(target: float, delta: float, q: float, steps: int) -> float:
    """Only orders with c(α, δ) < target can certify the target (ρ > 0), so only those are
    computed; the min over them decides ε(σ) ≤ target exactly as the min over all `ORDERS`."""
    orders = np.asarray(ORDERS)
    offsets = _conversion(orders, delta)
    useful = offsets < target
    if not useful.any():
        raise ValueError(
            f"epsilon = {target} at delta = {delta} is unreachable with RDP orders up to "
            f"{ORDERS[-1]:g}: even σ → ∞ gives epsilon ≥ {offsets.min():.4g}"
        )
    orders = orders[useful]

    def eps_of(sigma: float) -> float:
        rdp = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
        return _rdp_to_eps(rdp, orders, delta)

    return _smallest_sigma(eps_of, target, 1.0, SIGMA_RTOL["rdp"], (target, delta, q, steps))


@functools.lru_cache(maxsize=256)
def _calibrate_prv(target: float, delta: float, q: float, steps: int) -> float:
    """Starts from the RDP σ (PRV's ε is tighter, so its σ is at most about as large)."""

    def eps_of(sigma: float) -> float:
        return prv_epsilon([(sigma, q, steps)], delta)

    start = _calibrate_rdp(target, delta, q, steps)
    return _smallest_sigma(eps_of, target, start, SIGMA_RTOL["prv"], (target, delta, q, steps))


def _smallest_sigma(
    eps_of: Callable[[float], float],
    target: float,
    start: float,
    rtol: float,
    cell: tuple[float, float, float, int],
) -> float:
    """Smallest σ with eps_of(σ) ≤ target (eps_of decreasing), to relative precision `rtol`.

    Brackets the root from `start` (steps of ε/target in σ, as if ε ∝ 1/σ), then shrinks the
    bracket by interpolating log ε linearly in log σ and probing rtol/3 past the estimate, away
    from the end already nearest to it, so a good estimate closes the bracket in one or two
    probes; a probe that does not halve the bracket is followed by a bisection. Returns the
    upper end, whose ε was evaluated and meets the target.
    """
    log_target = math.log(target)
    low = high = None  # (log σ, log ε) with ε > target, resp. ε ≤ target
    sigma = start
    while low is None or high is None:
        if not 0 < sigma < SIGMA_MAX:
            raise ValueError(
                "epsilon = {} at delta = {} (q = {}, steps = {}) needs sigma beyond "
                "[0, {:g}]".format(*cell, SIGMA_MAX)
            )
        eps = eps_of(sigma)
        point = (math.log(sigma), math.log(eps) if eps > 0 else -math.inf)
        if eps <= target:
            high = point
            sigma = sigma * min(max(eps / target, 0.5), 0.99) if low is None else sigma
        else:
            low = point
            sigma = sigma * min(max(eps / target, 1.01), 2.0) if high is None else sigma
    bisect = False
    while high[0] - low[0] > math.log1p(rtol):
        width = high[0] - low[0]
        x = (low[0] + high[0]) / 2
        if not bisect and math.isfinite(low[1]) and math.isfinite(high[1]):
            root = low[0] + (low[1] - log_target) * width / (low[1] - high[1])
            x = root - rtol / 3 if high[0] - root < root - low[0] else root + rtol / 3
        if not low[0] < x < high[0]:
            x = (low[0] + high[0]) / 2
        eps = eps_of(math.exp(x))
        point = (x, math.log(eps) if eps > 0 else -math.inf)
        if eps <= target:
            high = point
        else:
            low = point
        bisect = high[0] - low[0] > width / 2
    return math.exp(high[0])


def _check_accountant(name: str) -> None:
    if name not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant '{name}' (known: {', '.join(ACCOUNTANTS)})")
