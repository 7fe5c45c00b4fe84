"""The xcal study's grid (paper 001): axes and wildcard patterns (the datasets registered for
xcal, classifier models, `METHODS`, `SHIFTS`), which cells are jobs, and the config rules a
schema cannot express. A light module: the rule file imports it at parse time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.config.study import param_sets
from dpmed.config.wildcards import EPS_PATTERN
from dpmed.data.registry import study_datasets
from dpmed.errors import ConfigError
from dpmed.models import models_of_kind
from dpmed.xcal.methods import METHODS, eps_problem, method_regex, split_method
from dpmed.xcal.shifts import POOLED, SHIFTS

DATASETS = study_datasets("xcal")
MODELS = models_of_kind("classifier")
AXES = (
    ("datasets", "dataset"),
    ("models", "model"),
    ("methods", "method"),
    ("shifts", "shift"),
    ("clients", "clients"),
    ("eps", "eps"),
    ("seeds", "seed"),
)
PATTERNS = {
    "dataset": "|".join(DATASETS),
    "model": "|".join(MODELS),
    "method": method_regex(),
    "shift": SHIFTS.pattern(),
    "clients": r"[1-9][0-9]*",
    "eps": EPS_PATTERN,
    "seed": r"[0-9]+",
}
# The config values of the registry-named grid lists (schema enums and patterns at load).
CHOICES: dict[str, tuple[str, ...] | str] = {
    "datasets": DATASETS,
    "models": MODELS,
    "methods": method_regex(),
    "shifts": SHIFTS.names(),
}


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


def check_config(config: Mapping[str, Any], jobs: Sequence[Any]) -> None:
    """Config rules a schema cannot express: brightness low ≤ high; every preset method of
    the grid finds its preset in the job's `presets`; a job's clients share its dataset's
    training split, at least one image each."""
    for where, params in param_sets(config["xcal"]):
        if "brightness" in params:
            low, high = params["brightness"]
            if not low <= high:
                raise ConfigError(
                    f"xcal.{where}.brightness", f"need low <= high, got {low}, {high}"
                )
    for job in jobs:
        method = job.wc["method"]
        preset = split_method(method)[1]  # the config preset it needs, None: it takes none
        presets = job.params["presets"]
        if preset is not None and preset not in presets:
            raise ConfigError(
                f"{job.block}.methods",
                f"'{method}' needs xcal presets.{preset} (have: {', '.join(sorted(presets))})",
            )
        # the split's size is known here for synthetic data; a download is counted when the
        # job partitions it
        dataset = config["data"][job.wc["dataset"]]
        if dataset["raw"] != "synthetic":
            continue
        clients, n_train = int(job.wc["clients"]), dataset["synthetic"]["counts"][0]
        if clients > n_train:
            raise ConfigError(
                f"{job.block}.clients",
                f"{clients} clients but data.{job.wc['dataset']}.synthetic.counts gives "
                f"{n_train} training images; every client needs at least one",
            )
