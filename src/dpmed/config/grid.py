"""Expand the studies' grid blocks into jobs (wildcards + hyperparameters).

A block is the product of its lists; its `params` override the study `defaults`. A seg block
may add `sweep: {clip_norm: [...], lr: [...]}` (paper 002 Fig. 2): each clip rule then becomes
one job per (C, lr) with the clip wildcard `<rule>-C<C>-lr<lr>` and those two params. Invalid
combinations (e.g. clip `none` with a finite ε) are dropped with a stated reason; a block that
yields no job, or two blocks that give one job different hyperparameters, is a config error.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpmed.config.wildcards import (
    SWEEP_KEYS,
    WILDCARD_PATTERNS,
    clip_overrides,
    clip_rule,
    format_eps,
    sweep_clip,
)
from dpmed.data.registry import DATASETS
from dpmed.errors import ConfigError
from dpmed.seeding import stable_seed


def _seg_invalid(wc: Mapping[str, str]) -> str | None:
    private = wc["eps"] != "inf"
    if (clip_rule(wc["clip"]) == "none") == private:
        return "clip 'none' pairs with eps inf, every other clip with a finite eps"
    if wc["morph"].startswith("adaptive") and wc["dataset"] != "duke":
        return "adaptive DP-Morph needs the multi-class retinal layers of duke"
    return None


def _fets_invalid(wc: Mapping[str, str]) -> str | None:
    private = wc["eps"] != "inf"
    dp_aggregator = wc["aggregator"].startswith("dp_")
    if dp_aggregator != private:
        return "dp_* aggregators need a finite eps, fedavg/simagg need eps inf"
    if (wc["dpmode"] == "none") == dp_aggregator:
        return "dpmode 'none' pairs with the non-private aggregators only"
    if wc["aggregator"] == "dp_fedavg" and wc["dpmode"] != "sound":
        return "dp_fedavg has only the sound mode"
    return None


def _xcal_invalid(wc: Mapping[str, str]) -> str | None:
    private = wc["eps"] != "inf"
    method = wc["method"]
    if method == "nondp" and private:
        return "nondp needs eps inf"
    if method not in ("nondp", "centralized") and not private:
        return f"{method} is a DP method and needs a finite eps"
    if (method == "centralized") != (wc["clients"] == "1"):
        return "centralized runs have clients 1, federated runs at least 2"
    if method == "centralized" and wc["shift"] != "iid":
        return "centralized runs pool the data: shift iid only"
    return None


@dataclass(frozen=True)
class Study:
    """How one study's blocks map to output folders.

    `axes` pairs each block list key with its wildcard; `invalid` returns why a combination is
    dropped (None if valid).
    """

    name: str
    path: str
    axes: tuple[tuple[str, str], ...]
    invalid: Callable[[Mapping[str, str]], str | None]


STUDIES: dict[str, Study] = {
    "seg": Study(
        "seg",
        "results/seg/{dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}",
        (
            ("datasets", "dataset"),
            ("models", "model"),
            ("clips", "clip"),
            ("morphs", "morph"),
            ("eps", "eps"),
            ("seeds", "seed"),
        ),
        _seg_invalid,
    ),
    "fets": Study(
        "fets",
        "results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}",
        (("aggregators", "aggregator"), ("dpmodes", "dpmode"), ("eps", "eps"), ("seeds", "seed")),
        _fets_invalid,
    ),
    "xcal": Study(
        "xcal",
        "results/xcal/{dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed}",
        (
            ("datasets", "dataset"),
            ("models", "model"),
            ("methods", "method"),
            ("shifts", "shift"),
            ("clients", "clients"),
            ("eps", "eps"),
            ("seeds", "seed"),
        ),
        _xcal_invalid,
    ),
}


@dataclass(frozen=True)
class Job:
    """One cell of a study grid: its wildcards, hyperparameters and the block it came from."""

    study: str
    wildcards: tuple[tuple[str, str], ...]
    params: Mapping[str, Any]
    block: str

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


def _swept(
    wildcards: tuple[tuple[str, str], ...],
    params: Mapping[str, Any],
    sweep: Mapping[str, list[float]] | None,
) -> list[tuple[tuple[tuple[str, str], ...], dict[str, Any]]]:
    """The jobs of one grid combination: itself, or one per (clip_norm, lr) of a seg sweep."""
    if not sweep:
        return [(wildcards, dict(params))]
    wc = dict(wildcards)
    out = []
    for values in itertools.product(*(sweep[k] for k in SWEEP_KEYS)):
        cell = dict(zip(SWEEP_KEYS, values, strict=True))
        clip = sweep_clip(wc["clip"], **cell)
        job_params = _merged(params, {k: float(v) for k, v in cell.items()})
        out.append((tuple((k, clip if k == "clip" else v) for k, v in wildcards), job_params))
    return out


def expand_study(config: Mapping[str, Any], study: str) -> list[Job]:
    """All valid jobs of `study`, in block order, without duplicates.

    Raises ConfigError naming the block when it yields no valid job, and naming both blocks
    when two give the same job different hyperparameters.
    """
    spec = STUDIES[study]
    section = config[study]
    jobs: dict[tuple[tuple[str, str], ...], Job] = {}
    for index, block in enumerate(section["grid"]):
        key = f"{study}.grid[{index}]"
        params = _merged(section["defaults"], block.get("params", {}))
        reasons: set[str] = set()
        produced = 0
        lists = [block[axis] for axis, _ in spec.axes]
        for combo in itertools.product(*lists):
            combination = tuple(
                (wc, _spell(wc, value)) for (_, wc), value in zip(spec.axes, combo, strict=True)
            )
            if block.get("sweep") and clip_rule(dict(combination)["clip"]) == "none":
                reasons.add("a sweep (clip_norm × lr) applies to private clip rules only")
                continue
            for wildcards, job_params in _swept(combination, params, block.get("sweep")):
                reason = spec.invalid(dict(wildcards))
                if reason:
                    reasons.add(reason)
                    continue
                produced += 1
                job = Job(study, wildcards, job_params, key)
                previous = jobs.get(wildcards)
                if previous is not None and previous.params != job_params:
                    raise ConfigError(
                        key,
                        f"job {job.path} is also in {previous.block} with different params; "
                        "give each job one set of hyperparameters",
                    )
                jobs.setdefault(wildcards, job)
        if produced == 0:
            raise ConfigError(key, "no valid combination: " + "; ".join(sorted(reasons)))
    return list(jobs.values())


class Grid:
    """All jobs of the three studies, expanded once from a validated config."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = config
        self._jobs = {
            study: {job.wildcards: job for job in expand_study(config, study)} for study in STUDIES
        }

    def jobs(self, study: str) -> list[Job]:
        """The study's jobs in block order."""
        return list(self._jobs[study].values())

    def targets(self, study: str, filename: str) -> list[str]:
        """`<job folder>/<filename>` for every job of the study."""
        return [f"{job.path}/{filename}" for job in self.jobs(study)]

    def params(self, study: str, wildcards: Mapping[str, str]) -> dict[str, Any]:
        """Hyperparameters of the job with `wildcards`: its block's, or the study defaults for
        a file target outside the grid (so any cell can be run by naming its output)."""
        key = tuple((wc, str(wildcards[wc])) for _, wc in STUDIES[study].axes)
        job = self._jobs[study].get(key)
        if job is not None:
            return copy.deepcopy(dict(job.params))
        swept = clip_overrides(str(wildcards["clip"])) if study == "seg" else {}
        return _merged(self._config[study]["defaults"], swept)

    def datasets(self) -> list[str]:
        """Datasets read by any job, in registry order."""
        used = {job.wc["dataset"] for study in ("seg", "xcal") for job in self.jobs(study)}
        if self._jobs["fets"]:
            used.add("fets")
        return [name for name in DATASETS if name in used]


def job_seed(study: str, wildcards: Mapping[str, str]) -> int:
    """The RNG seed of a job: a stable hash of the study and all its wildcards."""
    ordered = [f"{wc}={wildcards[wc]}" for _, wc in STUDIES[study].axes]
    return stable_seed(study, *ordered)


def wildcards_from_path(study: str, path: str | Path) -> dict[str, str]:
    """The wildcards of the job folder `path` is (or lies in), e.g. a run's alignment.csv.

    Raises ValueError when `path` is not inside a job folder of `study`.
    """
    parts = re.split(r"\{(\w+)\}", STUDIES[study].path)  # literal, name, literal, ...
    pattern = "".join(
        f"(?P<{part}>{WILDCARD_PATTERNS[part]})" if i % 2 else re.escape(part)
        for i, part in enumerate(parts)
    )
    match = re.search(rf"(?:^|/){pattern}(?:/|$)", Path(path).as_posix())
    if match is None:
        raise ValueError(f"{path} is not inside a {study} job folder ({STUDIES[study].path})")
    return match.groupdict()
