"""Distinct cells of a grid: the jobs that cost the same per step, probed once.

A job's cost per step and its memory depend on what it builds and runs, not on its seed or
its learning rate, and its privacy budget ε changes only the noise multiplier σ (a scalar):
the tensors, their shapes and the code path are the same at every finite ε. So jobs are
grouped by a *shape key* and one representative per group is timed and memory-probed; σ is
still calibrated for every distinct ε of the group (`Cell.eps`). What the key keeps, which
cells share one probe (`probe_key`: cells that differ only in scalars of the same
computation) and which part of a probe no method changes (`shared_key`) each study's sizing
says (`dpmed.sizing.StudySizing`, in `<study>/sizing.py`); this module iterates over the
study registry.

Each cell keeps its own rows: σ calibrated for its ε, its own requests checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpmed.config.grid import Grid, Job
from dpmed.config.wildcards import parse_eps
from dpmed.sizing import study_sizing
from dpmed.studies import STUDIES, part_module

CELL_FILE = "cell.json"  # per probed cell, in the preflight's logs/<index>/ folder


def study_rules() -> dict[str, tuple[str, ...]]:
    """study → the job_cost rules its cells are priced under, for every registered study with a
    preflight probe (`dpmed.<study>.probe`)."""
    return {
        study: tuple(study_sizing(study).rules) for study in STUDIES if part_module(study, "probe")
    }


def shape_key(study: str, wildcards: Mapping[str, str], params: Mapping[str, Any]) -> tuple:
    """The key of jobs that build the same tensors and run the same code: the study and its
    sizing's `shape_key`."""
    return (study, *study_sizing(study).shape_key(wildcards, params))


def probe_key(cell: Cell) -> tuple:
    """The key of cells one probe measures: the study and its sizing's `probe_key`."""
    return (cell.study, *study_sizing(cell.study).probe_key(cell.key[1:]))


def shared_key(cell: Cell) -> tuple | None:
    """The key of the part of `cell`'s probe that no method changes, measured once for every
    cell with that key (None: the study's probe has no such part)."""
    key = study_sizing(cell.study).shared_key
    return None if key is None else (cell.study, *key(cell.job.wc, cell.job.params))


@dataclass
class Cell:
    """One distinct cell: its representative job (the first in grid order), every job it
    stands for and the distinct finite ε of those jobs (each gets its own σ)."""

    study: str
    key: tuple
    job: Job
    jobs: list[Job] = field(default_factory=list)

    @property
    def name(self) -> str:
        """A readable id, unique in a grid: the representative's wildcards without seed and ε,
        and `/nonprivate` for a cell of ε = inf (xcal's centralized cells differ in nothing
        else)."""
        wc = {k: v for k, v in self.job.wc.items() if k not in ("seed", "eps")}
        private = any(math.isfinite(eps) for eps in self.eps)
        return f"{self.study}/" + "/".join(wc.values()) + ("" if private else "/nonprivate")

    @property
    def eps(self) -> list[float]:
        """The distinct ε of the cell's jobs, ascending (inf for a non-private cell)."""
        return sorted({parse_eps(job.wc["eps"]) for job in self.jobs})


def rule_jobs(cell: Cell, rule: str) -> list[Job]:
    """The jobs of `cell` that run `rule` (the rule's sizing says which, e.g. seg_attack only
    in blocks with the attack on)."""
    return study_sizing(cell.study).rules[rule].runs(cell.jobs)


def distinct_cells(grid: Grid, studies: Iterable[str] | None = None) -> list[Cell]:
    """The distinct cells of `grid` (of `studies`; default every study with a probe,
    `study_rules`), in grid order; every job is in exactly one."""
    cells: dict[tuple, Cell] = {}
    for study in study_rules() if studies is None else studies:
        for job in grid.jobs(study):
            key = shape_key(study, job.wc, job.params)
            cell = cells.setdefault(key, Cell(study, key, job))
            cell.jobs.append(job)
    return list(cells.values())


def _features(cell: Cell) -> set[tuple[str, str]]:
    """What a cell shows the sample: its sizing's `sample_features` (models, methods) and the
    ε of its jobs."""
    sizing = study_sizing(cell.study)
    out: set[tuple[str, str]] = set()
    for job in cell.jobs:
        names = [*sizing.sample_features(cell.key[1:], job.wc), f"eps={parse_eps(job.wc['eps']):g}"]
        out |= {(cell.study, name) for name in names}
    return out


def sample_cells(cells: Sequence[Cell]) -> list[Cell]:
    """A small subset of `cells` that still shows every model, every method and every ε of
    each study (`_features`): greedy set cover, taking the cell that adds the most unseen
    features (ties: grid order); returned in grid order."""
    missing = set().union(*(_features(c) for c in cells)) if cells else set()
    chosen: list[Cell] = []
    while missing:
        best = max(cells, key=lambda c: len(_features(c) & missing))
        chosen.append(best)
        missing -= _features(best)
    order = {id(c): i for i, c in enumerate(cells)}
    return sorted(chosen, key=lambda c: order[id(c)])


def cost_features(cell: Cell) -> tuple:
    """What a cell's cost per step depends on, most first (its sizing's `cost_features`);
    `nearest` compares cells on these in order."""
    return study_sizing(cell.study).cost_features(cell.key[1:], cell.job.params)


def nearest(cell: Cell, probed: Sequence[Cell]) -> Cell | None:
    """The probed cell of `cell`'s study most like it: the one whose `cost_features` match
    `cell`'s, feature by feature in order, compared lexicographically (the same dataset
    first, then model, ...; the first in `probed` on ties); None when no cell of the study
    was probed."""
    mine = cost_features(cell)

    def matches(other: Cell) -> tuple[bool, ...]:
        return tuple(a == b for a, b in zip(mine, cost_features(other), strict=True))

    candidates = [c for c in probed if c.study == cell.study]
    return max(candidates, key=matches) if candidates else None
