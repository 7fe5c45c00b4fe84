"""The claims layer's error rates at the level users read, the claim-level verdict, by
simulation with known truth through `dpmed.report.claims` (`evaluate` then `claim_verdicts`):
a false `supported` and a false `contradicted` each at most `ALPHA` (within three binomial
standard errors of the simulation), and the power of a clear effect."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmed.report.claims import ALPHA, Claim, claim_verdicts, evaluate, observations

REPLICATES = 400
TOLERANCE = 3 * math.sqrt(ALPHA * (1 - ALPHA) / REPLICATES)


def _claim(test: str = "greater", **kw) -> Claim:
    return Claim("x", "paper 0 §1", "x", "score", "a", "b", test, "a and b", ("t",), **kw)


def _rates(claim: Claim, truths: list[float], seeds: int, sd: float, seed: int) -> dict:
    """Claim-level verdict frequencies over `REPLICATES` runs whose cells' true paired
    differences are `truths` (Normal noise of SD `sd`, `seeds` pairs per cell)."""
    rng = np.random.default_rng(seed)
    counts = {"supported": 0, "contradicted": 0, "inconclusive": 0}
    for _ in range(REPLICATES):
        rows = [
            dict(claim="x", cell=f"c{i}", seed=s, arm=truth + d, baseline=0.0)
            for i, truth in enumerate(truths)
            for s, d in enumerate(rng.normal(0.0, sd, seeds))
        ]
        table = claim_verdicts([claim], evaluate("s", [claim], observations(rows)))
        counts[table.loc[0, "verdict"]] += 1
    return {verdict: n / REPLICATES for verdict, n in counts.items()}


@pytest.mark.parametrize("combine", ["every", "any"])
def test_a_null_effect_is_rarely_supported_or_contradicted(combine):
    rates = _rates(_claim(combine=combine), [0.0] * 5, seeds=5, sd=1.0, seed=1)
    assert rates["supported"] <= ALPHA + TOLERANCE
    assert rates["contradicted"] <= ALPHA + TOLERANCE


def test_a_clear_effect_is_supported_and_its_opposite_contradicted():
    claim = _claim()
    assert _rates(claim, [2.0, 2.0, 2.0], seeds=6, sd=1.0, seed=2)["supported"] >= 0.8
    assert _rates(claim, [-2.0, -2.0, -2.0], seeds=6, sd=1.0, seed=3)["contradicted"] >= 0.8


def test_an_equivalence_at_its_margin_is_rarely_supported():
    claim = _claim("equivalent", margin=0.5)
    rates = _rates(claim, [0.5] * 3, seeds=8, sd=0.3, seed=4)
    assert rates["supported"] <= ALPHA + TOLERANCE


def test_an_equivalence_inside_its_margin_is_rarely_contradicted():
    """Ten cells each truly within the margin: before the correction, any one cell's 95 %
    interval outside the margin contradicted the claim (about 0.16 of runs)."""
    claim = _claim("equivalent", margin=0.5)
    rates = _rates(claim, [0.45] * 10, seeds=3, sd=0.3, seed=5)
    assert rates["contradicted"] <= ALPHA + TOLERANCE


def test_an_effect_below_the_smallest_that_matters_is_never_supported():
    claim = _claim(smallest_effect=0.01)
    rates = _rates(claim, [0.001], seeds=10, sd=0.0002, seed=6)
    assert rates["supported"] == 0.0
    assert _rates(_claim(), [0.001], seeds=10, sd=0.0002, seed=6)["supported"] >= 0.8
