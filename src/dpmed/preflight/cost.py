"""Projected cost of a job from a probe's measures: the runtime model `dpmed.job_cost` fits
(`dpmed.sizing`), Σ count × seconds of one unit over the job's units of work, with the
seconds the probe of its cell measured at the configured sizes instead of fitted ones. The
counts are the job's own (its params and the configured data sizes); each study's
`<study>/sizing.py` says what its rules' units are and which measure times each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpmed.job_cost import rule_sizing, work


def measured_seconds(
    rule: str, data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any],
    measures: Mapping[str, float],
) -> tuple[float, float]:  # fmt: skip
    """(steps, seconds) of one job of `rule` on the device the probe ran on: the count of its
    rule's step unit, and Σ count × measured seconds of one unit (`Work.measure`, divided by
    `Work.per` where the probe timed several units at once)."""
    units = work(rule, data, wc, hp)
    seconds = sum(
        unit.count * measures[unit.measure] / (measures[unit.per] if unit.per else 1.0)
        for unit in units.values()
    )
    return units[rule_sizing(rule).step].count, seconds


def step_measure(
    rule: str, data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> str:
    """The measure giving the seconds of one step of `rule` (its sizing's step unit)."""
    return work(rule, data, wc, hp)[rule_sizing(rule).step].measure
