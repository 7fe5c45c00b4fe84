"""ε of a sequence of (Poisson-subsampled) Gaussian mechanisms, via Opacus' accountants.

A history is a list of `(noise_multiplier, sample_rate, steps)` triples, Opacus' own format: a
run whose σ changes over time (XCal-FL) lists one triple per stretch of constant σ; a mechanism
without subsampling (server-side DP in FeTS) uses sample_rate 1. The noise multiplier is the
noise std divided by the L2 sensitivity.
"""

from __future__ import annotations

from collections.abc import Sequence

from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

History = Sequence[tuple[float, float, int]]
ACCOUNTANTS = ("rdp", "prv")


def epsilon(history: History, delta: float, accountant: str = "rdp") -> float:
    """ε at `delta` after the mechanisms in `history` (0 for an empty history)."""
    if not history:
        return 0.0
    acc = _accountant(accountant)
    acc.history = [(float(s), float(q), int(n)) for s, q, n in history]
    return float(acc.get_epsilon(delta))


def noise_multiplier(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> float:
    """Smallest noise multiplier (to Opacus' tolerance 0.01 in ε) with ε ≤ target after
    `steps` mechanisms at `sample_rate`."""
    return float(
        get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant=accountant,
            epsilon_tolerance=0.01,
        )
    )


def _accountant(name: str) -> RDPAccountant | PRVAccountant:
    if name == "rdp":
        return RDPAccountant()
    if name == "prv":
        return PRVAccountant()
    raise ValueError(f"unknown accountant '{name}' (known: {', '.join(ACCOUNTANTS)})")
