"""The toy study's spec: one job per (dataset, ε, seed), one table; and its dataset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpmed.config.study import StudySpec
from dpmed.config.wildcards import EPS_PATTERN, parse_eps
from dpmed.data.registry import DATASET_REGISTRY, DatasetEntry, study_datasets
from dpmed.report.outputs import ReportOutput, report_targets

# a PneumoniaMNIST-like dataset of the toy study (its facts, generator and loader)
DATASET_REGISTRY.add(
    "toymnist",
    DatasetEntry(
        **{**vars(DATASET_REGISTRY["pneumoniamnist"]), "label": "ToyMNIST", "study": "toy"}
    ),
)

RUN_FILES = ("metrics.json", "privacy.json")
REPORTS = {
    "toy_table": ReportOutput(
        writer="dpmed.toy.report:write_toy_table",
        files={"csv_path": ("results/tables/toy", "toy_table")},
        subcategory="Table 1",
        inputs=lambda jobs: {"metrics": [f"{job.path}/metrics.json" for job in jobs]},
    )
}


def targets(jobs: Sequence[Any]) -> list[str]:
    """Every run's files, then the table."""
    runs = [f"{job.path}/{name}" for job in jobs for name in RUN_FILES]
    return runs + report_targets(REPORTS, jobs)


SPEC = StudySpec(
    name="toy",
    path="results/toy/{dataset}/eps{eps}/seed{seed}",
    axes=(("datasets", "dataset"), ("eps", "eps"), ("seeds", "seed")),
    patterns={"dataset": "|".join(study_datasets("toy")), "eps": EPS_PATTERN, "seed": r"[0-9]+"},
    invalid=lambda wc: None if parse_eps(wc["eps"]) > 0 else "ε must be positive",
    run_files=RUN_FILES,
    category="toy",
    targets=targets,
    reports=REPORTS,
    choices={"datasets": study_datasets("toy")},
    audit_settings=("record",),
)
