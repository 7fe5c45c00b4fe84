"""The xcal study's outputs (paper 001): the files of every run, the registry of tables and
figures that rules/report.smk generates (their report groups: the paper's sections, as it has
no numbered tables or figures), `rule all`'s targets and the run files the claims read. A light
module: the rule file imports it at parse time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.registry import Registry
from dpmed.report.outputs import ReportOutput, report_targets
from dpmed.xcal.shifts import POOLED

RUN_FILES = (
    "rounds.csv",
    "metrics.json",
    "privacy.json",
    "road.json",
    "gradcam.npz",
    "model.pt",
    "config.json",
)
TABLES = ("xcal_main", "xcal_efficiency", "xcal_clients", "xcal_shift", "xcal_ablation")
# Measured wall-clock: written under results/measured/, outside the byte-identical outputs.
MEASURED_TABLES = ("xcal_runtime",)
FIGURES = ("xcal_trajectories", "xcal_clients_shift", "xcal_ablation", "xcal_gradcam")
# Report subcategory of every table and figure: the paper (001) has no numbered tables or
# figures, so its sections.
REPORT_GROUPS = {
    "xcal_main": "§6 results",
    "xcal_trajectories": "§6 results",
    "xcal_efficiency": "§6 results",
    "xcal_gradcam": "§6 results",
    "xcal_clients": "§6 clients and shift",
    "xcal_shift": "§6 clients and shift",
    "xcal_clients_shift": "§6 clients and shift",
    "xcal_ablation": "§7 ablation",
    "xcal_runtime": "§8 runtime",
}


def run_targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job."""
    return [f"{job.path}/{name}" for job in jobs for name in RUN_FILES]


def _runs(jobs: Sequence[Any]) -> dict[str, Any]:
    return {"_runs": run_targets(jobs)}


def _run_dirs(name: str, keyword: str) -> Any:
    def params(jobs: Sequence[Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return {"run_dirs": [job.path for job in jobs], keyword: name}

    return params


# Rule name → table/figure (`dpmed.report.outputs`), in `rule all` order: the tables
# (results/tables, then the measured one in results/measured), the figures, then the
# privacy–utility figure of the IID runs. A new one is its builder in dpmed.xcal.report, its
# entry here and its caption in captions/.
REPORTS: Registry[ReportOutput] = Registry("xcal report")
for _folder, _names in (("tables", TABLES), ("measured", MEASURED_TABLES)):
    for _name in _names:
        REPORTS.add(
            f"{_name}_table",
            ReportOutput(
                "dpmed.xcal.report:write_xcal_table",
                {"csv_path": (f"results/{_folder}/{_name}", _name)},
                REPORT_GROUPS[_name],
                inputs=_runs,
                params=_run_dirs(_name, "table"),
            ),
        )
for _name in FIGURES:
    REPORTS.add(
        f"{_name}_figure",
        ReportOutput(
            "dpmed.xcal.report:write_xcal_figure",
            {"png_path": (f"results/figures/{_name}", f"{_name}_figure")},
            REPORT_GROUPS[_name],
            inputs=_runs,
            params=_run_dirs(_name, "figure"),
        ),
    )
REPORTS.add(
    "xcal_privacy_utility_figure",
    ReportOutput(
        "dpmed.xcal.report:privacy_utility_report",
        {
            "png_path": ("results/figures/xcal_privacy_utility", "xcal_privacy_utility"),
            "csv_path": ("results/tables/xcal_privacy_utility", "xcal_privacy_utility"),
        },
        "privacy vs utility",
        inputs=lambda jobs: {
            "metrics_paths": [f"{j.path}/metrics.json" for j in jobs if j.wc["shift"] == POOLED]
        },
        wanted=lambda jobs: [{}] if any(job.wc["shift"] == POOLED for job in jobs) else [],
    ),
)


def targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job, then the tables, measured tables and figures (none of
    them when the grid has no xcal job; the privacy–utility figure when it has IID runs)."""
    return [*run_targets(jobs), *report_targets(REPORTS, jobs)]


def claims_inputs(jobs: Sequence[Any]) -> dict[str, list[str]]:
    """The run files the xcal claims (`dpmed.xcal.claims`) are judged on."""
    return {"metrics_paths": [f"{job.path}/metrics.json" for job in jobs]}
