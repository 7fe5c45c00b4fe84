"""XCal-FL's budget: the signal/gradient split of ε, the Rényi filter of the gradients, and the
scale that makes the run's proven bound reach the target ε (equal spent ε with static DP-FL).

A split of ε into f·ε (signal) and (1 − f)·ε (gradients), each calibrated on its own, composes
sequentially to ε; but the bound the run proves (`filter_bound`) is the smaller of that and one
RDP → (ε, δ) conversion at the filter's order α*, which is tighter by about a tenth of ε at the
paper's f = 0.1. A run calibrated to ε would thus spend visibly less than the static DP-FL run it
is compared with. `calibrate` therefore splits a calibration budget s·ε (s ≥ 1) instead, with s
found by a bracketed secant search so that the proven bound after all planned steps lies in
[(1 − BOUND_RTOL)·ε, ε]: never above the target, and at most BOUND_RTOL below it. The paper's
own operating point, s = 1 (`split_budget` at scale 1), is run beside it as `xcal-paper`.

`control_schedule` gives XCal-FL's random-σ_t control its σ_1 … σ_T, drawn before training and
matched to the filter's budget so that the control runs every planned step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.polynomial import Chebyshev

from dpmed.privacy.accounting import ORDERS, compute_rdp, noise_multiplier
from dpmed.privacy.adaptive import RenyiFilter, conversion_offset, epsilon_of, rdp_curve

BOUND_RTOL = 1e-3  # the proven bound ends in [(1 − BOUND_RTOL) ε, ε]
MAX_EVALUATIONS = 40
# The control's σ schedule spends RDP in [(1 − CONTROL_RTOL) B, (1 − CONTROL_RTOL / 1000) B] at α*:
# a little below B, so accountant round-off can never make the filter raise or halt it.
CONTROL_RTOL = 1e-6
CHEBYSHEV_DEGREE = 32  # log RDP is analytic in σ on the band: round-off accuracy at this degree


@dataclass(frozen=True)
class Budget:
    """One client's XCal-FL calibration: the scale s of the split budget s·ε, the signal's and
    the reference gradient noise multipliers, the filter's order index (α* in `ORDERS`) and RDP
    budget B, and the proven bound after all planned steps."""

    scale: float
    sigma_signal: float
    sigma_ref: float
    order_index: int
    rdp_budget: float
    bound: float


def filter_bound(
    sample_rate: float,
    sigma_signal: float,
    steps: int,
    order_index: int,
    rdp_budget: float,
    delta: float,
    fraction: float,
) -> float:
    """The whole run's guarantee at δ: the signal over all `steps` planned steps plus the
    gradients' filter (RDP at α* at most B). The smaller of sequential composition (the
    signal's ε at f·δ plus B + c(α*, (1 − f)·δ)) and one conversion at α*
    (ρ_signal(α*) + B + c(α*, δ)); both hold for any adaptively chosen σ_t and halts."""
    signal_all = rdp_curve(sample_rate, sigma_signal, steps)
    order = ORDERS[order_index]
    sequential = (
        epsilon_of(signal_all, fraction * delta)
        + rdp_budget
        + conversion_offset(order, (1 - fraction) * delta)
    )
    one_order = signal_all[order_index] + rdp_budget + conversion_offset(order, delta)
    return float(min(sequential, one_order))


def split_budget(
    scale: float, epsilon: float, delta: float, q: float, steps: int, fraction: float, band: float
) -> Budget:
    """The split of s·ε calibrated for `steps` steps (at least 1) at rate q, and its proven
    bound."""
    steps = max(1, int(steps))
    eps_signal, eps_grad = fraction * scale * epsilon, (1 - fraction) * scale * epsilon
    delta_signal, delta_grad = fraction * delta, (1 - fraction) * delta
    sigma_signal = noise_multiplier(eps_signal, delta_signal, q, steps)
    sigma_ref = noise_multiplier(eps_grad, delta_grad, q, steps)
    flt = RenyiFilter.for_target(eps_grad, delta_grad, q, sigma_ref, steps, (1 + band) * sigma_ref)
    bound = filter_bound(q, sigma_signal, steps, flt.order_index, flt.budget, delta, fraction)
    return Budget(scale, sigma_signal, sigma_ref, flt.order_index, flt.budget, bound)


@functools.lru_cache(maxsize=256)
def calibrate(
    epsilon: float, delta: float, q: float, steps: int, fraction: float, band: float
) -> Budget:
    """The budget whose proven bound after `steps` planned steps (at least 1) is within
    [(1 − BOUND_RTOL) ε, ε].

    s = 1 is feasible (sequential composition of the two calibrated shares is at most ε); the
    search grows s by the ratio ε / bound until the bound passes ε, then narrows the bracket
    by secant steps (bisection where a secant step would leave it). RuntimeError if no s within
    `MAX_EVALUATIONS` evaluations lands in the window.
    """
    low = split_budget(1.0, epsilon, delta, q, steps, fraction, band)
    high: Budget | None = None
    aim = epsilon * (1 - BOUND_RTOL / 2)
    for _ in range(MAX_EVALUATIONS):
        if low.bound >= (1 - BOUND_RTOL) * epsilon:
            return low
        if high is None:
            scale = low.scale * aim / low.bound
        else:
            slope = (high.bound - low.bound) / (high.scale - low.scale)
            scale = low.scale + (aim - low.bound) / slope if slope > 0 else 0.0
            if not low.scale < scale < high.scale:
                scale = 0.5 * (low.scale + high.scale)
        trial = split_budget(scale, epsilon, delta, q, steps, fraction, band)
        if trial.bound <= epsilon:
            low = trial
        else:
            high = trial
    raise RuntimeError(
        f"XCal-FL calibration found no budget with a proven bound within {BOUND_RTOL:g} below "
        f"epsilon = {epsilon:g} (q = {q:g}, {steps} steps); best {low.bound:.6g}"
    )


def control_schedule(
    uniforms: Sequence[float], sigma_ref: float, band: float, q: float, order: float, budget: float
) -> np.ndarray:
    """σ_t = (1 + b)σ_ref − λ·2b·σ_ref·(1 − u_t) for the draws u_t ∈ [0, 1): uniform on the
    top of the band [(1 + b − 2bλ)σ_ref, (1 + b)σ_ref], λ ∈ (0, 1] chosen so that the T steps'
    RDP at the filter's order α* spends the filter's budget B (`CONTROL_RTOL`), or λ = 1 (the
    whole band) when that spends no more. Draws uniform on the whole band cost more than T
    steps at σ_ref (the RDP is convex in σ) and a filter would halt them before step T; these
    never halt and spend what XCal-FL's bound allows. λ is searched on a Chebyshev interpolant
    of the one-step RDP over the band, then Newton-corrected on the exact sum (the accountant's
    series at fractional orders has kinks the interpolant smooths over)."""
    u = np.asarray(uniforms, dtype=float)
    top, width = (1 + band) * sigma_ref, 2 * band * sigma_ref
    if len(u) == 0 or width == 0:
        return top - width * (1 - u)
    low, high = budget * (1 - CONTROL_RTOL), budget * (1 - CONTROL_RTOL / 1000)

    def cost(sigmas: np.ndarray) -> np.ndarray:
        return np.array([compute_rdp(q=q, noise_multiplier=s, steps=1, orders=[order])[0]
                         for s in sigmas])  # fmt: skip

    log_cost = Chebyshev.interpolate(
        lambda s: np.log(cost(s)), CHEBYSHEV_DEGREE, [top - width, top]
    )

    def surrogate(lam: float) -> float:
        return float(np.exp(log_cost(top - lam * width * (1 - u))).sum())

    lam = _spend_scale(surrogate, low, high)
    for _ in range(MAX_EVALUATIONS):
        exact = float(cost(top - lam * width * (1 - u)).sum())
        if exact <= high and (lam == 1.0 or exact >= low):
            return top - lam * width * (1 - u)
        slope = (surrogate(lam + 1e-6) - surrogate(lam - 1e-6)) / 2e-6
        lam = min(1.0, lam - (exact - (low + high) / 2) / slope)
    raise RuntimeError(f"no control schedule within {CONTROL_RTOL:g} below the budget {budget:g}")


def _spend_scale(spent: Callable[[float], float], low: float, high: float) -> float:
    """λ = 1 when spent(1) ≤ high, else a λ ∈ (0, 1) with spent(λ) in [low, high] (spent grows
    with λ and spent(0) < low), by regula falsi with the Illinois modification."""
    fb = spent(1.0) - high
    if fb <= 0:
        return 1.0
    (a, fa), b, side = (0.0, spent(0.0) - high), 1.0, 0
    for _ in range(MAX_EVALUATIONS):
        lam = (a * fb - b * fa) / (fb - fa)
        f = spent(lam) - high
        if low - high <= f <= 0:
            return lam
        if f < 0:
            (a, fa), fb = (lam, f), fb / 2 if side == -1 else fb
            side = -1
        else:
            (b, fb), fa = (lam, f), fa / 2 if side == 1 else fa
            side = 1
    raise RuntimeError(f"regula falsi found no lambda within {CONTROL_RTOL:g} below {high:g}")
