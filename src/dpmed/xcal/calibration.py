"""XCal-FL's budget: the signal/gradient split of ε, the Rényi filter of the gradients, and the
scale that makes the run's proven bound reach the target ε (equal spent ε with static DP-FL).

A split of ε into f·ε (signal) and (1 − f)·ε (gradients), each calibrated on its own, composes
sequentially to ε; but the bound the run proves (`filter_bound`) is the smaller of that and one
RDP → (ε, δ) conversion at the filter's order α*, which is tighter by about a tenth of ε at the
paper's f = 0.1. A run calibrated to ε would thus spend visibly less than the static DP-FL run it
is compared with. `calibrate` therefore splits a calibration budget s·ε (s ≥ 1) instead, with s
found by a bracketed secant search so that the proven bound after all planned steps lies in
[(1 − BOUND_RTOL)·ε, ε]: never above the target, and at most BOUND_RTOL below it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dpmed.privacy.accounting import ORDERS, noise_multiplier
from dpmed.privacy.adaptive import RenyiFilter, conversion_offset, epsilon_of, rdp_curve

BOUND_RTOL = 1e-3  # the proven bound ends in [(1 − BOUND_RTOL) ε, ε]
MAX_EVALUATIONS = 40


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


def _budget(
    scale: float, epsilon: float, delta: float, q: float, steps: int, fraction: float, band: float
) -> Budget:
    """The split of s·ε calibrated for `steps` steps at rate q, and its proven bound."""
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
    steps = max(1, int(steps))
    low = _budget(1.0, epsilon, delta, q, steps, fraction, band)
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
        trial = _budget(scale, epsilon, delta, q, steps, fraction, band)
        if trial.bound <= epsilon:
            low = trial
        else:
            high = trial
    raise RuntimeError(
        f"XCal-FL calibration found no budget with a proven bound within {BOUND_RTOL:g} below "
        f"epsilon = {epsilon:g} (q = {q:g}, {steps} steps); best {low.bound:.6g}"
    )
