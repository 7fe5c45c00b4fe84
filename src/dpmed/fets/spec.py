"""The fets study's grid and outputs (paper 000): axes, validity, wildcard patterns, run files,
tables and figures. The rule file imports it at parse time, so it imports no torch, pandas or
matplotlib (the aggregator registry it reads needs only numpy)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpmed.config.study import StudySpec
from dpmed.config.wildcards import EPS_PATTERN
from dpmed.fets.aggregation import AGGREGATORS, DP_MODES

# Files every fets_train job writes into its folder (checkpoint.pt is not among them: it is
# only there while a job runs or after it was killed).
RUN_FILES = (
    "rounds.csv",
    "selection.csv",
    "metrics.json",
    "privacy.json",
    "resources.json",
    "model.pt",
)


@dataclass(frozen=True)
class Output:
    """A table or figure of the study (its caption, workflow/report/<caption>.rst, is its key
    in `TABLES` / `FIGURES`).

    Args:
        stem: the path without extension (tables: .csv and .md, figures: .png and .pdf).
        group: the report subcategory: the paper's table or figure.
    """

    stem: str
    group: str


TABLES = {
    "fets_table2": Output("results/tables/fets_table2", "Table II"),
    "fets_resources": Output("results/measured/fets_resources", "Table II"),
    "fets_privacy": Output("results/tables/fets_privacy", "sound vs paper"),
}
FIGURES = {
    "fets_fig1": Output("results/figures/fets_fig1_patients_per_institution", "Fig. 1"),
    "fets_fig3": Output("results/figures/fets_fig3_selection", "Fig. 3"),
    "fets_fig4": Output("results/figures/fets_fig4_rounds", "Fig. 4"),
}


def invalid(wc: Mapping[str, str]) -> str | None:
    """Why a fets combination is not a job (None when it is one): the aggregator must support
    the DP mode (its registry entry), and a private DP mode needs a finite eps, `none` eps inf."""
    modes = AGGREGATORS[wc["aggregator"]].modes
    if wc["dpmode"] not in modes:
        plural = "s" if len(modes) > 1 else ""
        return f"{wc['aggregator']} has only the {'/'.join(modes)} mode{plural}"
    if DP_MODES[wc["dpmode"]].private != (wc["eps"] != "inf"):
        return "private DP modes need a finite eps, dpmode 'none' needs eps inf"
    return None


def run_targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job."""
    return [f"{job.path}/{name}" for job in jobs for name in RUN_FILES]


def targets(jobs: Sequence[Any]) -> list[str]:
    """The study's final outputs: run files, tables and figures ([] without jobs)."""
    if not jobs:
        return []
    tables = [f"{out.stem}.csv" for out in TABLES.values()]
    figures = [f"{out.stem}.png" for out in FIGURES.values()]
    return [*run_targets(jobs), *tables, *figures]


SPEC = StudySpec(
    name="fets",
    path="results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}",
    axes=(("aggregators", "aggregator"), ("dpmodes", "dpmode"), ("eps", "eps"), ("seeds", "seed")),
    patterns={
        "aggregator": AGGREGATORS.pattern(),
        "dpmode": DP_MODES.pattern(),
        "eps": EPS_PATTERN,
        "seed": r"[0-9]+",
    },
    invalid=invalid,
    run_files=RUN_FILES,
    targets=targets,
    category="fets (paper 000)",
)
