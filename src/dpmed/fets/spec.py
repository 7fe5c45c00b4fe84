"""The fets study's grid and outputs (paper 000): axes, validity, wildcard patterns, run
files. A light module: the rule file imports it at parse time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.config.study import StudySpec
from dpmed.config.wildcards import EPS_PATTERN

FETS_AGGREGATORS = ("fedavg", "simagg", "dp_simagg", "dp_fedavg")
FETS_DPMODES = ("none", "paper", "sound")
RUN_FILES = ("rounds.csv", "selection.csv", "metrics.json", "privacy.json", "resources.json")


def invalid(wc: Mapping[str, str]) -> str | None:
    """Why a fets combination is not a job (None when it is one)."""
    private = wc["eps"] != "inf"
    dp_aggregator = wc["aggregator"].startswith("dp_")
    if dp_aggregator != private:
        return "dp_* aggregators need a finite eps, fedavg/simagg need eps inf"
    if (wc["dpmode"] == "none") == dp_aggregator:
        return "dpmode 'none' pairs with the non-private aggregators only"
    if wc["aggregator"] == "dp_fedavg" and wc["dpmode"] != "sound":
        return "dp_fedavg has only the sound mode"
    return None


def targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job (tables and figures: the rule file adds them for now)."""
    return [f"{job.path}/{name}" for job in jobs for name in RUN_FILES]


SPEC = StudySpec(
    name="fets",
    path="results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}",
    axes=(("aggregators", "aggregator"), ("dpmodes", "dpmode"), ("eps", "eps"), ("seeds", "seed")),
    patterns={
        "aggregator": "|".join(FETS_AGGREGATORS),
        "dpmode": "|".join(FETS_DPMODES),
        "eps": EPS_PATTERN,
        "seed": r"[0-9]+",
    },
    invalid=invalid,
    run_files=RUN_FILES,
    targets=targets,
    category="fets (paper 000)",
)
