"""What a study tells the generic grid and the rule files: its axes, run folder, wildcard
patterns, validity rule and run files. Each study package defines one `StudySpec` in its
`spec.py`; `dpmed.studies.STUDIES` registers them (and finds the study's other parts by name)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpmed.seeding import stable_seed

# The wildcards of one grid cell, in axis order: (("dataset", "duke"), ("model", "unet"), ...).
Wildcards = tuple[tuple[str, str], ...]
# A grid cell's jobs after a block's `sweep`: (wildcards, params) pairs, or why there are none.
SweepResult = list[tuple[Wildcards, dict[str, Any]]] | str


def param_sets(section: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """A study section's defaults and every block's params override, with their key paths
    (`defaults`, `grid[2].params`), for checks that name the key at fault."""
    sets = [("defaults", section["defaults"])]
    sets += [
        (f"grid[{i}].params", block["params"])
        for i, block in enumerate(section["grid"])
        if "params" in block
    ]
    return sets


def block_params(section: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The hyperparameters of grid block `index`: the study defaults, its `params` on top."""
    return {**section["defaults"], **section["grid"][index].get("params", {})}


def param_key(study: str, section: Mapping[str, Any], index: int, name: str) -> str:
    """The key path that sets hyperparameter `name` for the jobs of grid block `index`: the
    block's `params` override if it has one, else the study default."""
    if name in section["grid"][index].get("params", {}):
        return f"{study}.grid[{index}].params.{name}"
    return f"{study}.defaults.{name}"


def paired_seed(study: str, paired: Sequence[str], wildcards: Mapping[str, str], role: str) -> int:
    """`StudySpec.common_seed` of a study named `study` with `paired` wildcards (for a study's
    outputs, which are defined before its spec)."""
    return stable_seed(study, role, *(f"{wc}={wildcards[wc]}" for wc in paired))


@dataclass(frozen=True)
class StudySpec:
    """One study's grid and output layout.

    Args:
        name: the study (`seg`, `fets`, `xcal`): config section, rule and output prefix.
        path: the run folder template, e.g. `results/fets/{aggregator}/.../seed{seed}`.
        axes: (block list key, wildcard) pairs in path order.
        patterns: wildcard → regex of its allowed values (Snakemake wildcard constraints).
        invalid: why a combination of wildcards is not a job (None when it is one).
        run_files: the files the training rule writes into every run folder.
        category: the report category of the study's tables and figures.
        targets: the study's final outputs (run files, tables, figures) for its expanded
            jobs (`dpmed.config.grid.Job`s); [] when the grid has none. `rule all` and the
            `<study>_results` rule read it.
        sweep: expands one cell by a block's `sweep` mapping (None: the study has no sweeps).
        wildcard_params: hyperparameters a wildcard value spells (for off-grid file targets).
        check: the study's config rules a schema cannot express, given the whole config (its
            section and the data it reads) and its expanded jobs; raises `ConfigError` naming
            the key.
        reports: rule name → `dpmed.report.outputs.ReportOutput` of the study's tables and
            figures that rules/report.smk generates (a study may also write its own rules).
        notes: for the expanded jobs, the tables and figures the grid cannot feed and what
            grid cells they need (printed when the workflow loads).
        switches: block keys that choose which outputs a job's run gets, not how it trains
            (key → default, e.g. seg's `attack`); each job carries its block's values in
            `Job.switches`, outside its hyperparameters, so flipping one retrains nothing.
        paired: the wildcards of a seed block: runs that differ only in the other wildcards
            (the compared factors: clip rule, morphology, ε, aggregator, DP mode, method) draw
            their initial weights, data order, partition and schedules from the same seeds
            (`dpmed.config.grid.common_seed`), so comparisons between them pair (common random
            numbers); their DP noise stays independent (`job_seed`, every wildcard).
        claims: the named input lists (run files) of the study's jobs that its claims reader
            (`dpmed.<study>.claims:study_observations`, `dpmed.report.claims`) takes (None:
            the study has no claims).
        audit_settings: the privacy audit settings the study's `audit.audit_cell` offers
            (read when the config is checked, so the spec stays free of torch; empty: the study
            offers no audit).
        choices: grid list key → the values the registries allow (a tuple: the schema's enum
            of its items; a str: the regex its items match), put into the study's config
            schema when it is loaded (`dpmed.config.checks.load_schema`), so a registered name
            is one registration.
    """

    name: str
    path: str
    axes: tuple[tuple[str, str], ...]
    patterns: Mapping[str, str]
    invalid: Callable[[Mapping[str, str]], str | None]
    run_files: tuple[str, ...]
    category: str
    targets: Callable[[Sequence[Any]], list[str]]
    sweep: Callable[[Wildcards, Mapping[str, Any], Mapping[str, Any]], SweepResult] | None = None
    wildcard_params: Callable[[Mapping[str, str]], dict[str, Any]] = lambda wildcards: {}
    check: Callable[[Mapping[str, Any], Sequence[Any]], None] = lambda config, jobs: None
    reports: Mapping[str, Any] = field(default_factory=dict)
    notes: Callable[[Sequence[Any]], list[str]] = lambda jobs: []
    switches: Mapping[str, bool] = field(default_factory=dict)
    paired: tuple[str, ...] = ("seed",)
    claims: Callable[[Sequence[Any]], Mapping[str, list[str]]] | None = None
    audit_settings: tuple[str, ...] = ()
    choices: Mapping[str, tuple[str, ...] | str] = field(default_factory=dict)

    @property
    def wildcards(self) -> tuple[str, ...]:
        """The wildcard names, in path order."""
        return tuple(wc for _, wc in self.axes)

    def job_seed(self, wildcards: Mapping[str, str]) -> int:
        """The RNG seed of a job: a stable hash of the study and all its wildcards. It drives
        what must stay independent between compared runs: the DP noise."""
        return stable_seed(self.name, *(f"{wc}={wildcards[wc]}" for wc in self.wildcards))

    def common_seed(self, wildcards: Mapping[str, str], role: str) -> int:
        """The seed of one source of randomness (`role`: init, order, schedule, ...) shared by
        every run of a seed block: a stable hash of the study, the role and the `paired`
        wildcards only. Runs that differ in a compared factor then start from the same weights
        and see the same batches and schedules (common random numbers), so paired tests over
        seeds pair."""
        return paired_seed(self.name, self.paired, wildcards, role)

    def log(self, rule: str, ext: str = "log") -> str:
        """`logs/<rule>/<wildcards as folders>.<ext>` (also the benchmark path with `tsv`)."""
        folder = "logs" if ext == "log" else "benchmarks"
        run = self.path.removeprefix(f"results/{self.name}/")
        return f"{folder}/{rule}/{run}.{ext}"
