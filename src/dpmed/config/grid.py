"""Expand the studies' grid blocks into jobs (wildcards + hyperparameters).

A block is the product of its lists; its `params` override the study `defaults`. A block may
add a `sweep` that the study's spec expands into several jobs per cell (seg: one per (C, lr)
of paper 002 Fig. 2). Combinations the spec calls invalid (e.g. clip `none` with a finite ε)
are dropped with its stated reason; a block that yields no job, or two blocks that give one job
different hyperparameters, is a config error. Which axes, paths and validity rules a study has
is its `StudySpec` (`dpmed.studies.STUDIES`).
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmed.config.study import Wildcards
from dpmed.config.wildcards import format_eps
from dpmed.data.registry import DATASET_REGISTRY, study_datasets
from dpmed.errors import ConfigError
from dpmed.studies import STUDIES


@dataclass(frozen=True)
class Job:
    """One cell of a study grid: its wildcards, hyperparameters, the block it came from and
    that block's output switches (`StudySpec.switches`)."""

    study: str
    wildcards: Wildcards
    params: Mapping[str, Any]
    block: str
    switches: Mapping[str, bool] = field(default_factory=dict)

    @property
    def wc(self) -> dict[str, str]:
        return dict(self.wildcards)

    @property
    def path(self) -> str:
        return STUDIES[self.study].path.format(**self.wc)


def _spell(wildcard: str, value: Any) -> str:
    if wildcard == "eps":
        return format_eps(value)
    if wildcard in ("seed", "clients"):
        return str(int(value))
    return str(value)


def _merged(defaults: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(defaults))
    out.update(copy.deepcopy(dict(override)))
    return out


def expand_study(config: Mapping[str, Any], study: str) -> list[Job]:
    """All valid jobs of `study`, in block order, without duplicates (none when the config has
    no section for it).

    Raises ConfigError naming the block when it yields no valid job, and naming both blocks
    when two give the same job different hyperparameters or switches.
    """
    spec = STUDIES[study]
    section = config.get(study, {"grid": []})
    jobs: dict[Wildcards, Job] = {}
    for index, block in enumerate(section["grid"]):
        key = f"{study}.grid[{index}]"
        params = _merged(section["defaults"], block.get("params", {}))
        switches = {key: bool(block.get(key, default)) for key, default in spec.switches.items()}
        reasons: set[str] = set()
        produced = 0
        lists = [block[axis] for axis, _ in spec.axes]
        for combo in itertools.product(*lists):
            combination = tuple(
                (wc, _spell(wc, value)) for (_, wc), value in zip(spec.axes, combo, strict=True)
            )
            cells = [(combination, dict(params))]
            if block.get("sweep"):
                cells = spec.sweep(combination, params, block["sweep"])
                if isinstance(cells, str):
                    reasons.add(cells)
                    continue
            for wildcards, job_params in cells:
                reason = spec.invalid(dict(wildcards))
                if reason:
                    reasons.add(reason)
                    continue
                produced += 1
                job = Job(study, wildcards, job_params, key, switches)
                previous = jobs.get(wildcards)
                if previous is not None and previous.params != job_params:
                    raise ConfigError(
                        key,
                        f"job {job.path} is also in {previous.block} with different params; "
                        "give each job one set of hyperparameters",
                    )
                if previous is not None and previous.switches != switches:
                    raise ConfigError(
                        key,
                        f"job {job.path} is also in {previous.block} with other "
                        f"{', '.join(sorted(spec.switches))}; give each job one value",
                    )
                jobs.setdefault(wildcards, job)
        if produced == 0:
            raise ConfigError(key, "no valid combination: " + "; ".join(sorted(reasons)))
    return list(jobs.values())


class Grid:
    """All jobs of the registered studies, expanded once from a validated config."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = config
        self._jobs = {
            study: {job.wildcards: job for job in expand_study(config, study)} for study in STUDIES
        }

    def jobs(self, study: str) -> list[Job]:
        """The study's jobs in block order."""
        return list(self._jobs[study].values())

    def params(self, study: str, wildcards: Mapping[str, str]) -> dict[str, Any]:
        """Hyperparameters of the job with `wildcards`: its block's, or the study defaults for
        a file target outside the grid (so any cell can be run by naming its output)."""
        key = tuple((wc, str(wildcards[wc])) for _, wc in STUDIES[study].axes)
        job = self._jobs[study].get(key)
        if job is not None:
            return copy.deepcopy(dict(job.params))
        spelled = STUDIES[study].wildcard_params(wildcards)
        return _merged(self._config[study]["defaults"], spelled)

    def notes(self) -> list[str]:
        """What the studies' targets leave out for this grid and why (`StudySpec.notes`)."""
        return [note for name, spec in STUDIES.items() for note in spec.notes(self.jobs(name))]

    def study_datasets(self, study: str) -> list[str]:
        """The datasets the jobs of `study` read, in registry order: their `dataset` wildcards,
        or for a study without one (fets) the datasets registered for it."""
        jobs = self.jobs(study)
        if "dataset" in STUDIES[study].wildcards:
            used = {job.wc["dataset"] for job in jobs}
        else:
            used = set(study_datasets(study)) if jobs else set()
        return [name for name in DATASET_REGISTRY if name in used]

    def datasets(self) -> list[str]:
        """Datasets read by any job, in registry order."""
        used = {name for study, _ in STUDIES.items() for name in self.study_datasets(study)}
        return [name for name in DATASET_REGISTRY if name in used]


def wildcard_patterns() -> dict[str, str]:
    """Every wildcard of every study, for Snakemake's global `wildcard_constraints` (so no rule
    matches a path it was not written for, e.g. `eps` never swallows a slash): the alternation
    of the studies' patterns (a wildcard two studies share, e.g. `model`, accepts either's
    values); `dataset` names every dataset of the data registry."""
    patterns: dict[str, list[str]] = {"dataset": [DATASET_REGISTRY.pattern()]}
    for _, spec in STUDIES.items():
        for wildcard, pattern in spec.patterns.items():
            if wildcard == "dataset":
                continue
            if pattern not in patterns.setdefault(wildcard, []):
                patterns[wildcard].append(pattern)
    return {wc: "|".join(f"(?:{p})" for p in alts) if len(alts) > 1 else alts[0]
            for wc, alts in patterns.items()}  # fmt: skip


def job_seed(study: str, wildcards: Mapping[str, str]) -> int:
    """`StudySpec.job_seed` of study `study` (the rules name the study)."""
    return STUDIES[study].job_seed(wildcards)


def common_seed(study: str, wildcards: Mapping[str, str], role: str) -> int:
    """`StudySpec.common_seed` of study `study`."""
    return STUDIES[study].common_seed(wildcards, role)


def wildcards_from_path(study: str, path: str | Path) -> dict[str, str]:
    """The wildcards of the job folder `path` is (or lies in), e.g. a run's alignment.csv.

    Raises ValueError when `path` is not inside a job folder of `study`.
    """
    parts = re.split(r"\{(\w+)\}", STUDIES[study].path)  # literal, name, literal, ...
    pattern = "".join(
        f"(?P<{part}>{STUDIES[study].patterns[part]})" if i % 2 else re.escape(part)
        for i, part in enumerate(parts)
    )
    match = re.search(rf"(?:^|/){pattern}(?:/|$)", Path(path).as_posix())
    if match is None:
        raise ValueError(f"{path} is not inside a {study} job folder ({STUDIES[study].path})")
    return match.groupdict()
