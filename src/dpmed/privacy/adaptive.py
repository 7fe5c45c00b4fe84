"""Per-client Rényi-DP ledger for heterogeneous noise, and the Rényi filter of XCal-FL.

Every mechanism here is a Poisson-subsampled Gaussian (sample rate q, noise multiplier σ = noise
std / L2 sensitivity). Its RDP curve ρ(α) at the orders `accounting.ORDERS` (1.01 … 10^4) comes
from `accounting.compute_rdp`; RDP adds up over mechanisms (also adaptively chosen ones, Feldman
& Zrnic 2021), and ε(δ) is Opacus' conversion `get_privacy_spent` (Balle et al. 2020, Thm 21):
ε = min_α [ρ(α) + c(α, δ)],  c(α, δ) = log((α−1)/α) − (log δ + log α)/(α − 1).

The Rényi filter (paper 001 App. B) guards the gradient budget (ε_g, δ_g) at ONE order α* fixed
before training (the order that is optimal for the reference schedule): its RDP budget is
B = ε_g − c(α*, δ_g). Before each step with proposed σ_t it admits the step if
spent(α*) + ρ_t(α*) ≤ B, else raises σ_t by bisection up to σ_max, else halts the client. The
spent RDP at α* then never exceeds B for any realised, adaptively chosen σ sequence, so the
gradient mechanism is (α*, B)-RDP and hence (ε_g, δ_g)-DP; the min over all orders reported by
`epsilon` is never larger.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from opacus.accountants.analysis.rdp import get_privacy_spent

from dpmed.privacy.accounting import ORDERS, compute_rdp

BISECTION_STEPS = 40


def rdp_curve(sample_rate: float, sigma: float, steps: int = 1) -> np.ndarray:
    """ρ(α) at `ORDERS` of `steps` Poisson-subsampled Gaussian mechanisms (q, σ)."""
    return np.asarray(
        compute_rdp(q=sample_rate, noise_multiplier=sigma, steps=steps, orders=ORDERS)
    )


def conversion_offset(order: float, delta: float) -> float:
    """c(α, δ) of the RDP → (ε, δ) conversion, so that ε = ρ(α) + c(α, δ)."""
    return float(np.log((order - 1) / order) - (np.log(delta) + np.log(order)) / (order - 1))


def epsilon_of(rdp: np.ndarray, delta: float) -> float:
    """ε at `delta` of an RDP curve (0 for an all-zero curve)."""
    if not np.any(rdp > 0):
        return 0.0
    return float(get_privacy_spent(orders=list(ORDERS), rdp=list(rdp), delta=delta)[0])


@dataclass
class RdpLedger:
    """RDP spent by one client, as a curve over `ORDERS`, with a log of (σ, q, steps) stretches.

    `history` merges consecutive steps with the same (σ, q) so it reads like Opacus' accountant
    history; `rdp` is the exact sum whatever the order of the steps.
    """

    rdp: np.ndarray = field(default_factory=lambda: np.zeros(len(ORDERS)))
    history: list[list[float]] = field(default_factory=list)

    def charge(self, sample_rate: float, sigma: float, steps: int = 1) -> None:
        """Add `steps` subsampled Gaussian mechanisms (q = sample_rate, σ)."""
        self.rdp = self.rdp + rdp_curve(sample_rate, sigma, steps)
        if self.history and self.history[-1][:2] == [sigma, sample_rate]:
            self.history[-1][2] += steps
        else:
            self.history.append([float(sigma), float(sample_rate), int(steps)])

    def epsilon(self, delta: float) -> float:
        """ε(δ) of everything charged so far."""
        return epsilon_of(self.rdp, delta)

    def state(self) -> dict:
        """Plain-data copy for checkpoints and for the client → server message."""
        return {"rdp": self.rdp.tolist(), "history": [list(h) for h in self.history]}

    @classmethod
    def from_state(cls, state: dict) -> RdpLedger:
        return cls(np.asarray(state["rdp"], dtype=float), [list(h) for h in state["history"]])


@dataclass
class RenyiFilter:
    """Admit, raise or halt adaptively chosen σ_t so spent(α*) never exceeds B(α*).

    `order_index` indexes `ORDERS` (α*); `budget` is B; `sigma_max` caps the bisection.
    """

    sample_rate: float
    order_index: int
    budget: float
    sigma_max: float
    ledger: RdpLedger = field(default_factory=RdpLedger)
    halted: bool = False
    raised: int = 0

    @classmethod
    def for_target(
        cls,
        epsilon: float,
        delta: float,
        sample_rate: float,
        reference_sigma: float,
        steps: int,
        sigma_max: float,
    ) -> RenyiFilter:
        """Filter for an (ε, δ) gradient budget; α* is the order at which `steps` mechanisms
        at `reference_sigma` reach their ε (so the reference schedule itself fits)."""
        curve = rdp_curve(sample_rate, reference_sigma, steps)
        eps = [r + conversion_offset(a, delta) for r, a in zip(curve, ORDERS, strict=True)]
        index = int(np.nanargmin(eps))
        budget = epsilon - conversion_offset(ORDERS[index], delta)
        return cls(sample_rate, index, float(budget), float(sigma_max))

    @property
    def order(self) -> float:
        return ORDERS[self.order_index]

    def _cost(self, sigma: float) -> float:
        curve = compute_rdp(
            q=self.sample_rate, noise_multiplier=sigma, steps=1, orders=[self.order]
        )
        return float(np.atleast_1d(curve)[0])

    def spent(self) -> float:
        """RDP spent at α*."""
        return float(self.ledger.rdp[self.order_index])

    def can_continue(self) -> bool:
        """False (and halted from now on) once even σ_max no longer fits the budget."""
        if not self.halted and self._cost(self.sigma_max) > self.budget - self.spent():
            self.halted = True
        return not self.halted

    def admit(self, sigma: float) -> float | None:
        """σ to use for the next step (≥ `sigma`), charged to the ledger, or None = halt.

        If σ itself fits, it is used; else the smallest σ' in (σ, σ_max] that fits (bisection
        to relative precision 2^-40, rounded up so it always fits); else the client halts.
        """
        if self.halted:
            return None
        room = self.budget - self.spent()
        if self._cost(sigma) > room:
            if self._cost(self.sigma_max) > room:
                self.halted = True
                return None
            low, high = sigma, self.sigma_max
            for _ in range(BISECTION_STEPS):
                mid = 0.5 * (low + high)
                low, high = (mid, high) if self._cost(mid) > room else (low, mid)
            sigma = high
            self.raised += 1
        self.ledger.charge(self.sample_rate, sigma)
        return sigma

    def state(self) -> dict:
        return {"ledger": self.ledger.state(), "halted": self.halted, "raised": self.raised}

    def load_state(self, state: dict) -> None:
        self.ledger = RdpLedger.from_state(state["ledger"])
        self.halted = bool(state["halted"])
        self.raised = int(state["raised"])
