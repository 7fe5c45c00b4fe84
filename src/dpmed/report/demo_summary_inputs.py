"""The run files `dpmed.report.demo_summary` reads, listed for the rule `demo_summary`. Apart
from the writer so that the Snakemake process, which reads the workflow, imports neither pandas
nor matplotlib."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.data.registry import processed_files
from dpmed.studies import STUDIES


def summary_inputs(jobs: Mapping[str, Sequence[Any]]) -> dict[str, list[str]]:
    """The run files the summary reads, from each study's jobs (`Grid.jobs`): seg metrics.json
    and the attacked cells' attack.json (as the seg claims read them), fets rounds.csv, xcal
    metrics.json and the processed meta.json (classes, test-set size) of each xcal dataset."""
    seg, xcal = jobs.get("seg", []), jobs.get("xcal", [])
    seg_claims = STUDIES["seg"].claims
    datasets = dict.fromkeys(job.wc["dataset"] for job in xcal)
    return {
        "seg_metrics": [f"{job.path}/metrics.json" for job in seg],
        "seg_attacks": seg_claims(seg)["attack_paths"] if seg_claims else [],
        "fets_rounds": [f"{job.path}/rounds.csv" for job in jobs.get("fets", [])],
        "xcal_metrics": [f"{job.path}/metrics.json" for job in xcal],
        "xcal_meta": [
            path
            for dataset in datasets
            for path in processed_files(dataset)
            if path.endswith("/meta.json")
        ],  # fmt: skip
    }
