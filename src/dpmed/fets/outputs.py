"""The fets study's outputs (paper 000): the files of every run, the registry of tables and
figures that rules/report.smk generates, `rule all`'s targets and the run files the claims read.
The rule file imports it at parse time (no torch, pandas or matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.config.study import paired_seed
from dpmed.data.registry import processed_files
from dpmed.fets.grid import PAIRED, sweep_jobs, table_jobs
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
        # as `fets.run`: `StudySpec.common_seed(wc, "schedule")`
        "seed": lambda wc: paired_seed("fets", PAIRED, jobs[0].wc, "schedule"),
    }


SPLITS = "data/processed/fets/splits.csv"
_WRITERS = "dpmed.fets.report"

# Rule name → table/figure (`dpmed.report.outputs`), in `rule all` order: a new table or figure
# is its writer in dpmed.fets.report, its entry here and its caption in captions/.
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
        f"{_WRITERS}:eps_sweep",
        {"png_path": ("results/figures/fets_eps_sweep", "fets_eps_sweep"),
         "csv_path": ("results/tables/fets_eps_sweep", "fets_eps_sweep_table")},
        "eps0 x collaborators per round",
        inputs=lambda jobs: {"_runs": run_targets(sweep_jobs(jobs))},
        params=lambda jobs, config: {"run_dirs": [job.path for job in sweep_jobs(jobs)]},
        wanted=lambda jobs: once_if_jobs(sweep_jobs(jobs)),
    ),
)  # fmt: skip


def run_targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job."""
    return [f"{job.path}/{name}" for job in jobs for name in RUN_FILES]


def targets(jobs: Sequence[Any]) -> list[str]:
    """The study's final outputs: run files, tables and figures ([] without jobs)."""
    return [*run_targets(jobs), *report_targets(REPORTS, jobs)]


def claims_inputs(jobs: Sequence[Any]) -> dict[str, list[str]]:
    """The run files the fets claims (`dpmed.fets.claims`) are judged on: the plain cells'."""
    return {
        f"{name}_paths": [f"{job.path}/{file}" for job in table_jobs(jobs)]
        for name, file in (
            ("metrics", "metrics.json"),
            ("resources", "resources.json"),
            ("rounds", "rounds.csv"),
        )
    }
