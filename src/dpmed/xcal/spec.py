"""The xcal study's grid and outputs (paper 001): axes, validity, wildcard patterns, run files,
tables, figures and their report groups. A light module: the Snakefile imports it at parse
time; the value lists come from the registries (datasets of the MedMNIST family, classifier
models, `METHODS`, `SHIFTS`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.config.study import ClaimSource, StudyAudit, StudySpec, param_sets
from dpmed.config.wildcards import EPS_PATTERN
from dpmed.data.registry import DATASET_REGISTRY
from dpmed.errors import ConfigError
from dpmed.models import models_of_kind
from dpmed.registry import Registry
from dpmed.report.outputs import ReportOutput, report_targets
from dpmed.xcal.methods import (
    METHODS,
    eps_problem,
    method_regex,
    required_preset,
    split_method,
)
from dpmed.xcal.shifts import POOLED, SHIFTS

DATASETS = tuple(name for name, entry in DATASET_REGISTRY.items() if entry.family == "medmnist")
MODELS = models_of_kind("classifier")
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
# Figures rules/report.smk generates (`dpmed.report.outputs`); the others are rules/xcal.smk's.
REPORTS: Registry[ReportOutput] = Registry("xcal report")
REPORTS.add(
    "xcal_privacy_utility_figure",
    ReportOutput(
        "dpmed.xcal.privacy_utility:privacy_utility_report",
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


def invalid(wc: Mapping[str, str]) -> str | None:
    """Why an xcal combination is not a job (None when it is one)."""
    problem = eps_problem(wc["method"], wc["eps"] != "inf")
    if problem:
        return problem
    method = METHODS[split_method(wc["method"])[0]]
    if method.federated == (wc["clients"] == "1"):
        return "centralized runs have clients 1, federated runs at least 2"
    if not method.federated and wc["shift"] != POOLED:
        return f"centralized runs pool the data: shift {POOLED} only"
    return None


def targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job, then the tables, measured tables and figures (none of
    them when the grid has no xcal job; the privacy–utility figure when it has IID runs)."""
    if not jobs:
        return []
    return (
        [f"{job.path}/{name}" for job in jobs for name in RUN_FILES]
        + [f"results/tables/{name}.csv" for name in TABLES]
        + [f"results/measured/{name}.csv" for name in MEASURED_TABLES]
        + [f"results/figures/{name}.png" for name in FIGURES]
        + report_targets(REPORTS, jobs)
    )


def check_config(config: Mapping[str, Any], jobs: Sequence[Any]) -> None:
    """Config rules a schema cannot express: brightness low ≤ high; every preset method of
    the grid finds its preset in the job's `presets`; a job's clients fit its training split
    (`_check_clients`)."""
    for where, params in param_sets(config["xcal"]):
        if "brightness" in params:
            low, high = params["brightness"]
            if not low <= high:
                raise ConfigError(
                    f"xcal.{where}.brightness", f"need low <= high, got {low}, {high}"
                )
    for job in jobs:
        method = job.wc["method"]
        preset = required_preset(method)
        presets = job.params["presets"]
        if preset is not None and preset not in presets:
            raise ConfigError(
                f"{job.block}.methods",
                f"'{method}' needs xcal presets.{preset} (have: {', '.join(sorted(presets))})",
            )
        _check_clients(config["data"], job)


def _check_clients(data: Mapping[str, Any], job: Any) -> None:
    """A job's `clients` share its dataset's training split, at least one image each. The
    split's size is known here for synthetic data (`synthetic.counts`); a real download is
    counted when the job partitions it."""
    dataset = data[job.wc["dataset"]]
    if dataset["raw"] != "synthetic":
        return
    clients, n_train = int(job.wc["clients"]), dataset["synthetic"]["counts"][0]
    if clients > n_train:
        raise ConfigError(
            f"{job.block}.clients",
            f"{clients} clients but data.{job.wc['dataset']}.synthetic.counts gives {n_train} "
            "training images; every client needs at least one",
        )


SPEC = StudySpec(
    name="xcal",
    path="results/xcal/{dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed}",
    axes=(
        ("datasets", "dataset"),
        ("models", "model"),
        ("methods", "method"),
        ("shifts", "shift"),
        ("clients", "clients"),
        ("eps", "eps"),
        ("seeds", "seed"),
    ),
    patterns={
        "dataset": "|".join(DATASETS),
        "model": "|".join(MODELS),
        "method": method_regex(),
        "shift": SHIFTS.pattern(),
        "clients": r"[1-9][0-9]*",
        "eps": EPS_PATTERN,
        "seed": r"[0-9]+",
    },
    invalid=invalid,
    run_files=RUN_FILES,
    targets=targets,
    category="xcal (paper 001)",
    check=check_config,
    reports=REPORTS,
    paired=("dataset", "model", "shift", "clients", "seed"),
    claims=ClaimSource(
        "dpmed.xcal.claims:xcal_observations",
        lambda jobs: {"metrics_paths": [f"{job.path}/metrics.json" for job in jobs]},
    ),
    rules="rules/xcal.smk",
    sizing="dpmed.xcal.sizing:SIZING",
    probe="dpmed.xcal.probe:PROBE",
    audit=StudyAudit(("gradient", "input"), "dpmed.xcal.audit:audit_cell"),
)
