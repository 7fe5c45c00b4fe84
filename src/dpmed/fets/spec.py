"""The fets study's grid and outputs (paper 000): axes, validity, wildcard patterns, the
participation sweep, run files, tables and figures. The rule file imports it at parse time, so
it imports no torch, pandas or matplotlib (the aggregator registry it reads needs only numpy)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.config.study import (
    ClaimSource,
    StudyAudit,
    StudySpec,
    SweepResult,
    Wildcards,
    block_params,
    param_key,
)
from dpmed.config.wildcards import EPS_PATTERN, NUMBER_PATTERN, format_eps
from dpmed.data.registry import processed_files
from dpmed.errors import ConfigError
from dpmed.fets.aggregation import AGGREGATORS, DP_MODES
from dpmed.registry import Registry
from dpmed.report.outputs import ReportOutput, once_if_jobs, report_targets

# Files every fets_train job writes into its folder (checkpoint.pt is not among them: it is
# only there while a job runs or after it was killed).
RUN_FILES = (
    "rounds.csv",
    "selection.csv",
    "metrics.json",
    "privacy.json",
    "resources.json",
    "model.pt",
    "config.json",
)


# A block's `sweep` (`participation: [ρ, ...]`) runs each of its cells once per ρ, the
# fraction of the K collaborators chosen per round (m = max(1, ⌊ρK⌋)); the aggregator wildcard
# then carries ρ, `dp_fedavg-rho0.4`, so a sweep run never shares a folder with a plain cell.
_RHO = re.compile(rf"^(.+)-rho({NUMBER_PATTERN})$")


def aggregator_pattern() -> str:
    """The regex of the aggregator wildcard: a registered aggregator, optionally `-rho<ρ>`."""
    return rf"(?:{AGGREGATORS.pattern()})(?:-rho{NUMBER_PATTERN})?"


def aggregator_name(aggregator: str) -> str:
    """The registered aggregator of an aggregator wildcard (`dp_fedavg-rho0.4` → `dp_fedavg`)."""
    match = _RHO.match(aggregator)
    return match.group(1) if match else aggregator


def participation_override(aggregator: str) -> dict[str, float]:
    """The participation ρ a swept aggregator wildcard sets ({} for a plain one)."""
    match = _RHO.match(aggregator)
    return {"participation": float(match.group(2))} if match else {}


def sweep_aggregator(name: str, participation: float) -> str:
    """The aggregator wildcard of one sweep cell (inverse of `aggregator_name` and
    `participation_override`).

    >>> sweep_aggregator("dp_fedavg", 0.4), participation_override(sweep_aggregator("fedavg", 1))
    ('dp_fedavg-rho0.4', {'participation': 1.0})
    """
    return f"{name}-rho{format_eps(participation)}"


def sweep(wildcards: Wildcards, params: Mapping[str, Any], cfg: Mapping[str, Any]) -> SweepResult:
    """One job per participation ρ of a block's sweep, the aggregator wildcard spelling it."""
    out = []
    for rho in cfg["participation"]:
        name = sweep_aggregator(dict(wildcards)["aggregator"], rho)
        wc = tuple((k, name if k == "aggregator" else v) for k, v in wildcards)
        out.append((wc, {**params, "participation": float(rho)}))
    return out


def is_swept(wildcards: Mapping[str, str]) -> bool:
    """A run of a participation sweep (its aggregator wildcard carries ρ)."""
    return _RHO.match(wildcards["aggregator"]) is not None


def table_jobs(jobs: Sequence[Any]) -> list[Any]:
    """The plain cells (Table II, the privacy and resources tables, Fig. 4)."""
    return [job for job in jobs if not is_swept(job.wc)]


def sweep_jobs(jobs: Sequence[Any]) -> list[Any]:
    """The runs of the participation sweeps (the ε0 × collaborators-per-round figure)."""
    return [job for job in jobs if is_swept(job.wc)]


def _run_dirs(jobs: Sequence[Any], config: Mapping[str, Any]) -> dict[str, Any]:
    return {"run_dirs": [job.path for job in table_jobs(jobs)]}


def _runs(jobs: Sequence[Any]) -> dict[str, Any]:
    return {"_runs": run_targets(table_jobs(jobs))}


def _plain_once(jobs: Sequence[Any]) -> list[dict[str, str]]:
    return once_if_jobs(table_jobs(jobs))


def _first_run(jobs: Sequence[Any]) -> dict[str, Any]:
    """Fig. 3 reads the selection log of the grid's first run (the runs of a seed block share
    the schedule at equal participation)."""
    selection = [f"{jobs[0].path}/selection.csv"] if jobs else []
    return {"_selection": selection, "_splits": [SPLITS]}


def _first_run_params(jobs: Sequence[Any], config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "selection_csv": lambda wc: f"{jobs[0].path}/selection.csv",
        "splits_csv": lambda wc: SPLITS,
        "params": lambda wc: jobs[0].params,
        "seed": lambda wc: SPEC.common_seed(jobs[0].wc, "schedule"),  # as `fets.run`
    }


SPLITS = "data/processed/fets/splits.csv"
_WRITERS = "dpmed.fets.report"

# Rule name → table/figure (`dpmed.report.outputs`), in `rule all` order: a new table or figure
# is its writer in dpmed.fets.report (the sweep's: dpmed.fets.sweep_report), its entry here and
# its caption in workflow/report/.
REPORTS: Registry[ReportOutput] = Registry("fets report")
for _name, _writer, _stem, _caption, _subcategory in (
    ("fets_table2", "table2", "results/tables/fets_table2", "fets_table2", "Table II"),
    ("fets_resources_table", "resources_table", "results/measured/fets_resources",
     "fets_resources", "Table II"),
    ("fets_privacy_table", "privacy_table", "results/tables/fets_privacy", "fets_privacy",
     "sound vs paper"),
):  # fmt: skip
    REPORTS.add(
        _name,
        ReportOutput(
            f"{_WRITERS}:{_writer}",
            {"csv_path": (_stem, _caption)},
            _subcategory,
            inputs=_runs,
            params=_run_dirs,
            wanted=_plain_once,
        ),
    )
REPORTS.add(
    "fets_figure1",
    ReportOutput(
        f"{_WRITERS}:figure1",
        {"png_path": ("results/figures/fets_fig1_patients_per_institution", "fets_fig1")},
        "Fig. 1",
        inputs=lambda jobs: {"_splits": [SPLITS]},
        params=lambda jobs, config: {"processed_dir": lambda wc: "data/processed/fets"},
    ),
)
REPORTS.add(
    "fets_figure2",
    ReportOutput(
        f"{_WRITERS}:figure2",
        {"png_path": ("results/figures/fets_fig2_modalities", "fets_fig2")},
        "Fig. 2",
        inputs=lambda jobs: {"_processed": processed_files("fets")},
        params=lambda jobs, config: {"processed_dir": lambda wc: "data/processed/fets"},
    ),
)
REPORTS.add(
    "fets_figure3",
    ReportOutput(
        f"{_WRITERS}:figure3_from_run",
        {"png_path": ("results/figures/fets_fig3_selection", "fets_fig3")},
        "Fig. 3",
        inputs=_first_run,
        params=_first_run_params,
    ),
)
REPORTS.add(
    "fets_figure4",
    ReportOutput(
        f"{_WRITERS}:figure4",
        {"png_path": ("results/figures/fets_fig4_rounds", "fets_fig4")},
        "Fig. 4",
        inputs=lambda jobs: {"_rounds": [f"{job.path}/rounds.csv" for job in table_jobs(jobs)]},
        params=_run_dirs,
        wanted=_plain_once,
    ),
)
REPORTS.add(
    "fets_eps_sweep",
    ReportOutput(
        "dpmed.fets.sweep_report:eps_sweep",
        {"png_path": ("results/figures/fets_eps_sweep", "fets_eps_sweep"),
         "csv_path": ("results/tables/fets_eps_sweep", "fets_eps_sweep_table")},
        "eps0 x collaborators per round",
        inputs=lambda jobs: {"_runs": run_targets(sweep_jobs(jobs))},
        params=lambda jobs, config: {"run_dirs": [job.path for job in sweep_jobs(jobs)]},
        wanted=lambda jobs: once_if_jobs(sweep_jobs(jobs)),
    ),
)  # fmt: skip


def invalid(wc: Mapping[str, str]) -> str | None:
    """Why a fets combination is not a job (None when it is one): the aggregator must support
    the DP mode (its registry entry), and a private DP mode needs a finite eps, `none` eps inf."""
    name = aggregator_name(wc["aggregator"])
    modes = AGGREGATORS[name].modes
    if wc["dpmode"] not in modes:
        plural = "s" if len(modes) > 1 else ""
        return f"{name} has only the {'/'.join(modes)} mode{plural}"
    if DP_MODES[wc["dpmode"]].private != (wc["eps"] != "inf"):
        return "private DP modes need a finite eps, dpmode 'none' needs eps inf"
    return None


def run_targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job."""
    return [f"{job.path}/{name}" for job in jobs for name in RUN_FILES]


def targets(jobs: Sequence[Any]) -> list[str]:
    """The study's final outputs: run files, tables and figures ([] without jobs)."""
    return [*run_targets(jobs), *report_targets(REPORTS, jobs)]


def _check_block(section: Mapping[str, Any], index: int) -> None:
    params = block_params(section, index)
    depth, patch, base = int(params["depth"]), list(params["patch_size"]), params["base_filters"]
    depth_key = param_key("fets", section, index, "depth")
    if any(side % 2**depth for side in patch):
        raise ConfigError(
            param_key("fets", section, index, "patch_size"),
            f"{patch}: the 3D ResUNet halves every side {depth} times ({depth_key} = {depth}), "
            f"so each side must divide by 2^{depth} = {2**depth}",
        )
    widths = [base * 2**level for level in range(depth + 1)]
    if params["norm"] == "group" and any(w >= 8 and w % 8 for w in widths):
        raise ConfigError(
            param_key("fets", section, index, "base_filters"),
            f"{base} gives level widths {widths} ({depth_key} = {depth}); GroupNorm splits c "
            "channels into min(8, c) groups, so widths of 8 or more must divide by 8 "
            "(use 1, 2, 4 or a multiple of 8)",
        )


def check_config(config: Mapping[str, Any], jobs: Sequence[Any]) -> None:
    """Config rules a schema cannot express, for every grid block's params: patch sides divide
    by 2^depth (the network halves and restores them), and with GroupNorm every level's
    width base_filters·2^level fits its min(8, width) groups."""
    for index in range(len(config["fets"]["grid"])):
        _check_block(config["fets"], index)


SPEC = StudySpec(
    name="fets",
    path="results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}",
    axes=(("aggregators", "aggregator"), ("dpmodes", "dpmode"), ("eps", "eps"), ("seeds", "seed")),
    patterns={
        "aggregator": aggregator_pattern(),
        "dpmode": DP_MODES.pattern(),
        "eps": EPS_PATTERN,
        "seed": r"[0-9]+",
    },
    invalid=invalid,
    run_files=RUN_FILES,
    targets=targets,
    category="fets (paper 000)",
    check=check_config,
    sweep=sweep,
    wildcard_params=lambda wc: participation_override(str(wc["aggregator"])),
    reports=REPORTS,
    claims=ClaimSource(
        "dpmed.fets.claims:fets_observations",
        lambda jobs: {
            f"{name}_paths": [f"{job.path}/{name}.json" for job in table_jobs(jobs)]
            for name in ("metrics", "resources")
        },
    ),
    rules="rules/fets.smk",
    sizing="dpmed.fets.sizing:SIZING",
    probe="dpmed.fets.probe:PROBE",
    audit=StudyAudit(("update",), "dpmed.fets.audit:audit_cell"),
)
