"""What a study tells the shared sizing layers (`dpmed.job_cost`, `dpmed.preflight`) about its
jobs: per rule, the memory features and the units of work its time is counted in; per study,
which jobs make one distinct cell to probe. A study's optional `<study>/sizing.py` defines one
`StudySizing` as `SIZING` (found by name, `dpmed.studies.study_part`); this module holds only
the shapes, so the study modules stay free of torch at import (Snakemake reads them when it
parses the workflow).

One runtime model serves both layers: a job's time is Σ count × seconds of one unit over its
`Work`, the seconds either fitted (`job_cost.json`: a coefficient × the unit's work `size`, plus
a per-unit coefficient) or measured by a preflight probe at the job's own sizes
(`Work.measure`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

# (the config's data section, a job's wildcards, its hyperparameters) → a rule's numbers
Sizer = Callable[[Mapping[str, Any], Mapping[str, str], Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Work:
    """One kind of work a job repeats (training steps, evaluation batches, ROAD passes, ...).

    Args:
        count: how many times the job runs it, from its config.
        size: the work of one unit in the fitted model's terms (e.g. images × pixels × width²);
            the fitted seconds of one unit are the coefficient `term` × `size` plus the
            unit's own coefficient (`count_<unit>`, its cost whatever its size).
        term: the fitted coefficient (`job_cost.json`) that prices it.
        measure: the preflight measure giving the seconds of one unit at the job's sizes.
        per: a measure counting the units `measure` timed at once (its seconds are divided by
            it); '' when `measure` times one unit.
    """

    count: float
    size: float
    term: str
    measure: str
    per: str = ""


@dataclass(frozen=True)
class RuleSizing:
    """One rule's sizing.

    Args:
        memory: the rule's memory features (`dpmed.job_cost`: fitted `const` and `act_*` terms,
            known `host` and `device` MB).
        work: unit name → `Work` of one job.
        step: the unit the preflight's tables count as the job's steps.
        runs: which of a cell's jobs run the rule (default: all).
    """

    memory: Sizer
    work: Sizer
    step: str
    runs: Callable[[Sequence[Any]], list[Any]] = list


@dataclass(frozen=True)
class StudySizing:
    """A study's sizing: its rules and what makes its jobs one distinct cell to probe.

    Args:
        rules: rule name → `RuleSizing`, in the order a cell's rules are priced.
        shape_key: (wildcards, params) → the key of jobs that build the same tensors and run
            the same code (they cost the same per step; `dpmed.preflight.run.distinct_cells`).
        probe_key: shape key → the key of cells one probe measures (cells that differ only in
            scalars of the same computation).
        cost_features: (shape key, params) → what a cell's cost per step depends on, most
            first (a skipped cell is projected from the probed cell matching these best).
        sample_features: (shape key, wildcards) → what a job of the cell shows a covering
            sample (its model and method names; the generic layer adds ε).
        shared_key: (wildcards, params) → the key of the part of a probe no method changes,
            measured once and shared by every cell with that key (None: the study has none).
    """

    rules: Mapping[str, RuleSizing]
    shape_key: Callable[[Mapping[str, str], Mapping[str, Any]], tuple]
    probe_key: Callable[[tuple], tuple]
    cost_features: Callable[[tuple, Mapping[str, Any]], tuple]
    sample_features: Callable[[tuple, Mapping[str, str]], list[str]]
    shared_key: Callable[[Mapping[str, str], Mapping[str, Any]], tuple] | None = None


def frozen(value: Any) -> Any:
    """A hashable copy of a params value (lists become tuples), for keys."""
    if isinstance(value, list | tuple):
        return tuple(frozen(v) for v in value)
    return value


def picked(params: Mapping[str, Any], names: Sequence[str]) -> tuple:
    """((name, value), ...) of the `names` that `params` has, hashable."""
    return tuple((k, frozen(params[k])) for k in names if k in params)


@cache
def study_sizing(study: str) -> StudySizing:
    """The sizing of registered study `study` (`dpmed.<study>.sizing:SIZING`, imported on first
    use); a study without one sizes no rules."""
    from dpmed.studies import study_part

    return study_part(study, "sizing", "SIZING") or StudySizing({}, *(lambda *_: (),) * 4)


def sized_rules() -> dict[str, str]:
    """rule → its study, for every sized rule of every registered study (registry order)."""
    from dpmed.studies import STUDIES

    return {rule: study for study in STUDIES for rule in study_sizing(study).rules}
