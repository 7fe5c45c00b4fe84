"""The one-run ε lower bound of Steinke, Nasr & Jagielski 2023 ("Privacy auditing with one (1)
training run", main theorem of Sec. 3, p-value and ε search of App. D).

Setting: m canaries, each included independently with probability ½ (S_i ∈ {in, out}); one
training run; the auditor scores every canary from the released output, then guesses "in" for
the k₊ highest scores and "out" for the k₋ lowest, abstaining on the rest (r = k₊ + k₋ guesses,
fixed before looking). If the training is (ε, δ)-DP with respect to each canary, the number W of
correct guesses obeys, for every v,

    P[W ≥ v] ≤ f(v) + 2mδ · max_{i = 1..v} (f(v − i) − f(v)) / i,
    f(v) = P[Binomial(r, e^ε/(1 + e^ε)) ≥ v],

i.e. with δ = 0, W is stochastically dominated by the correct answers of r independent ε-DP
randomized responses. Observing v correct guesses with that tail below β = 1 − confidence
rejects (ε, δ)-DP at level β; the reported lower bound is the largest such ε (bisection). A
rejected ε also rejects every smaller ε' (an (ε', δ)-DP mechanism is (ε, δ)-DP), so any ε whose
p-value is checked below β is a valid lower bound, whether or not the p-value is monotone in ε.

Choosing (k₊, k₋) after seeing the scores needs a correction: `best_audit` tries a fixed grid
and spends β/|grid| on each (union bound), so its maximum holds at the stated confidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.special import expit
from scipy.stats import binom

BISECTION_STEPS = 60
GUESS_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4)


def _check_counts(canaries: int | None, guesses: int, correct: int) -> None:
    if not 0 <= correct <= guesses:
        raise ValueError(f"need 0 <= correct <= guesses, got {correct} of {guesses}")
    if canaries is not None and guesses > canaries:
        raise ValueError(f"{guesses} guesses exceed the {canaries} canaries")


def binomial_tail(trials: int, successes: int, p: float) -> float:
    """P[Binomial(trials, p) ≥ successes] (1 for successes ≤ 0)."""
    return float(binom.sf(successes - 1, trials, p))


def p_value(canaries: int, guesses: int, correct: int, eps: float, delta: float) -> float:
    """Upper bound on P[W ≥ correct] for an (ε, δ)-DP training audited with `canaries` canaries
    and `guesses` guesses (the module's tail bound, capped at 1)."""
    _check_counts(canaries, guesses, correct)
    if eps < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need eps >= 0 and delta in [0, 1], got {eps}, {delta}")
    accuracy = float(expit(eps))  # e^ε/(1 + e^ε): the accuracy of ε-DP randomized response
    tail = binomial_tail(guesses, correct, accuracy)
    if delta == 0 or correct == 0:
        return min(tail, 1.0)
    # f(v − i) − f(v) = P[v − i ≤ Binomial < v] for i = 1..v; for i > v it stays f(0) − f(v)
    # while i grows, so the maximum over every i ≥ 1 is reached at some i ≤ v.
    below = binom.pmf(np.arange(correct - 1, -1, -1), guesses, accuracy)
    slope = float(np.max(np.cumsum(below) / np.arange(1, correct + 1)))
    return min(tail + 2 * canaries * delta * slope, 1.0)


def eps_lower_bound(
    guesses: int,
    correct: int,
    confidence: float = 0.95,
    delta: float = 0.0,
    *,
    canaries: int | None = None,
) -> float:
    """Largest ε (to 2⁻⁶⁰ of the search range) that `correct` of `guesses` guesses reject at
    `confidence`: p_value(ε) < 1 − confidence; 0 when even ε = 0 is not rejected.

    Args:
        guesses: r, the guesses made (abstentions excluded).
        correct: v, the correct ones.
        confidence: 1 − β, e.g. 0.95.
        delta: the δ of the hypothesis (ε, δ)-DP; δ > 0 needs `canaries`.
        canaries: m, the canaries (the δ term grows with 2mδ).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if delta > 0 and canaries is None:
        raise ValueError("delta > 0 needs the number of canaries")
    m = guesses if canaries is None else canaries
    _check_counts(m, guesses, correct)
    level = 1 - confidence
    if p_value(m, guesses, correct, 0.0, delta) >= level:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(m, guesses, correct, high, delta) < level:
        low, high = high, 2 * high
    for _ in range(BISECTION_STEPS):
        mid = (low + high) / 2
        if p_value(m, guesses, correct, mid, delta) < level:
            low = mid
        else:
            high = mid
    return low


@dataclass(frozen=True)
class AuditResult:
    """One audit: m canaries, r = k₊ + k₋ guesses, v correct, the ε lower bound at `confidence`
    for hypotheses (ε, `delta`)-DP."""

    canaries: int
    guesses: int
    correct: int
    eps_lower: float
    confidence: float
    delta: float
    k_pos: int
    k_neg: int


def audit_from_scores(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    k_pos: int,
    k_neg: int,
    confidence: float = 0.95,
    delta: float = 0.0,
) -> AuditResult:
    """Guess "in" for the `k_pos` highest scores and "out" for the `k_neg` lowest, then bound ε.

    Args:
        scores: (m,) one score per canary, higher meaning "more likely included"; ties are
            broken by canary index (stable sort), never by inclusion.
        included: (m,) whether each canary was in the training run.
        k_pos, k_neg: guesses of each kind, k_pos + k_neg ≤ m.
        confidence, delta: as in `eps_lower_bound`.
    """
    scores = np.asarray(scores, dtype=float)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    if scores.shape != (m,) or included.shape != (m,):
        raise ValueError(
            f"need 1-d scores and included of one length, got {scores.shape}, {included.shape}"
        )
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN")
    if k_pos < 0 or k_neg < 0 or k_pos + k_neg > m:
        raise ValueError(f"need k_pos, k_neg >= 0 and k_pos + k_neg <= {m}, got {k_pos}, {k_neg}")
    order = np.argsort(-scores, kind="stable")
    correct = int(included[order[:k_pos]].sum() + (~included[order[m - k_neg :]]).sum())
    guesses = k_pos + k_neg
    eps = eps_lower_bound(guesses, correct, confidence, delta, canaries=m)
    return AuditResult(m, guesses, correct, eps, confidence, delta, k_pos, k_neg)


def guess_grid(canaries: int) -> tuple[tuple[int, int], ...]:
    """The (k₊, k₋) pairs `best_audit` tries: k₊ = k₋ = max(1, round(f·m)) for each f in
    `GUESS_FRACTIONS` (1 % to 40 % of the canaries on each side), without repeats."""
    ks = {max(1, round(f * canaries)) for f in GUESS_FRACTIONS}
    return tuple((k, k) for k in sorted(ks) if 2 * k <= canaries)


def best_audit(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    confidence: float = 0.95,
    delta: float = 0.0,
    grid: Sequence[tuple[int, int]] | None = None,
) -> AuditResult:
    """The highest lower bound over the (k₊, k₋) pairs of `grid` (default `guess_grid(m)`),
    each audited at confidence 1 − β/|grid| so that the maximum holds at 1 − β = `confidence`
    (union bound); ties go to the first pair."""
    grid = guess_grid(len(scores)) if grid is None else tuple(grid)
    if not grid:
        raise ValueError("no (k_pos, k_neg) pair to try")
    each = 1 - (1 - confidence) / len(grid)
    results = [audit_from_scores(scores, included, kp, kn, each, delta) for kp, kn in grid]
    best = max(results, key=lambda r: r.eps_lower)  # max keeps the first of equal values
    return replace(best, confidence=confidence)
