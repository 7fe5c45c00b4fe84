"""The xcal study's grid and outputs (paper 001): axes, validity, wildcard patterns, run
files. A light module: the rule file imports it at parse time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.config.study import StudySpec
from dpmed.config.wildcards import EPS_PATTERN

XCAL_DATASETS = ("bloodmnist", "pneumoniamnist", "dermamnist")
XCAL_MODELS = ("resnet18", "efficientnet_b0")
XCAL_METHODS = ("nondp", "centralized", "static", "agp", "xcal")
XCAL_SHIFTS = ("iid", "label", "covariate")
RUN_FILES = ("rounds.csv", "metrics.json", "privacy.json", "road.json", "gradcam.npz")


def invalid(wc: Mapping[str, str]) -> str | None:
    """Why an xcal combination is not a job (None when it is one)."""
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


def targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job (tables and figures: the rule file adds them for now)."""
    return [f"{job.path}/{name}" for job in jobs for name in RUN_FILES]


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
        "dataset": "|".join(XCAL_DATASETS),
        "model": "|".join(XCAL_MODELS),
        "method": r"(?:nondp|centralized|static|agp|xcal)(?:-[a-z0-9]+)?",
        "shift": "|".join(XCAL_SHIFTS),
        "clients": r"[1-9][0-9]*",
        "eps": EPS_PATTERN,
        "seed": r"[0-9]+",
    },
    invalid=invalid,
    run_files=RUN_FILES,
    targets=targets,
    category="xcal (paper 001)",
)
