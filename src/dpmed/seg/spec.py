"""The seg study's grid and outputs (paper 002): axes, validity, wildcard patterns (from the clip
rule, morphology and model registries), the clip wildcard's sweep suffix, run files, and the
tables and figures `rule all` asks for. A light module: the rule file imports it at parse time.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpmed.config.study import StudySpec, SweepResult, Wildcards, param_sets
from dpmed.config.wildcards import EPS_PATTERN, NUMBER_PATTERN, format_eps
from dpmed.errors import ConfigError
from dpmed.models import models_of_kind
from dpmed.privacy.clipping import CLIP_RULES
from dpmed.registry import Registry
from dpmed.seg.morphology import has_quantiles, is_plain, morph_kind, morph_pattern, unsupported

# The seg datasets and the paper figure (Figs. 3–5) comparing the clip rules on each, in the
# order of every per-dataset table and figure.
DATASET_FIGURE = {"duke": "fig3", "umn": "fig4", "covidct": "fig5"}
SEG_DATASETS = tuple(DATASET_FIGURE)
# The datasets also scored with the structure measures S_α and E_φ (COVID-19 lung CT).
STRUCTURE_DATASETS = ("covidct",)
SEG_MODELS = models_of_kind("seg2d")

# A clip wildcard may carry a hyperparameter sweep (paper 002 Fig. 2): `flat-C0.5-lr0.001`.
SWEEP_KEYS = {"clip_norm": "C", "lr": "lr"}
_CLIP_SWEEP = re.compile(rf"^([a-z]+)-C({NUMBER_PATTERN})-lr({NUMBER_PATTERN})$")

# Files every seg_train job writes into its folder (checkpoint.pt is not among them: it is
# only there while a job runs or after it was killed); seg_attack adds ATTACK_FILE.
RUN_FILES = (
    "metrics.json",
    "history.csv",
    "morph_log.csv",
    "alignment.csv",
    "privacy.json",
    "model.pt",
)
ATTACK_FILE = "attack.json"


def clip_pattern() -> str:
    """The regex of the clip wildcard: a registered rule, optionally with a sweep suffix."""
    names = "|".join(CLIP_RULES.names())
    return rf"(?:{names})(?:-C{NUMBER_PATTERN}-lr{NUMBER_PATTERN})?"


def clip_rule(clip: str) -> str:
    """The clipping rule of a clip wildcard (`flat-C0.5-lr0.001` → `flat`)."""
    match = _CLIP_SWEEP.match(clip)
    return match.group(1) if match else clip


def clip_overrides(clip: str) -> dict[str, float]:
    """Hyperparameters a swept clip wildcard sets (`flat-C0.5-lr0.001` → clip_norm, lr)."""
    match = _CLIP_SWEEP.match(clip)
    if not match:
        return {}
    return {"clip_norm": float(match.group(2)), "lr": float(match.group(3))}


def sweep_clip(rule: str, clip_norm: float, lr: float) -> str:
    """The clip wildcard of one sweep cell (inverse of `clip_rule` + `clip_overrides`).

    >>> sweep_clip("flat", 0.5, 1e-3), clip_overrides(sweep_clip("flat", 2, 3e-05))
    ('flat-C0.5-lr0.001', {'clip_norm': 2.0, 'lr': 3e-05})
    """
    return f"{rule}-C{format_eps(clip_norm)}-lr{format_eps(lr)}"


def is_paper_cell(wildcards: Mapping[str, str]) -> bool:
    """A cell of the paper's main grid (Table 3, Figs. 3–5, 8): a plain clip rule and a morph
    without the ablation suffixes (lr × C sweep, quantiles, per-image scope)."""
    return wildcards["clip"] in CLIP_RULES and is_plain(wildcards["morph"])


def invalid(wc: Mapping[str, str]) -> str | None:
    """Why a seg combination is not a job (None when it is one)."""
    private = wc["eps"] != "inf"
    if CLIP_RULES[clip_rule(wc["clip"])].bounded != private:
        return "clip 'none' pairs with eps inf, every other clip with a finite eps"
    return unsupported(wc["morph"], wc["dataset"])


def sweep(wildcards: Wildcards, params: Mapping[str, Any], cfg: Mapping[str, Any]) -> SweepResult:
    """One job per (clip_norm, lr) of a block's sweep, the clip wildcard spelling both."""
    wc = dict(wildcards)
    if not CLIP_RULES[clip_rule(wc["clip"])].bounded:
        return "a sweep (clip_norm × lr) applies to private clip rules only"
    out = []
    for values in itertools.product(*(cfg[k] for k in SWEEP_KEYS)):
        cell = dict(zip(SWEEP_KEYS, values, strict=True))
        clip = sweep_clip(wc["clip"], **cell)
        job_params = {**params, **{k: float(v) for k, v in cell.items()}}
        out.append((tuple((k, clip if k == "clip" else v) for k, v in wildcards), job_params))
    return out


# --- which runs the tables and figures read (`jobs`: `dpmed.config.grid.Job`s) ---


def datasets_of(jobs: Sequence[Any]) -> list[str]:
    """The seg datasets with jobs, in `SEG_DATASETS` order."""
    return [d for d in SEG_DATASETS if any(job.wc["dataset"] == d for job in jobs)]


def paper_metrics(jobs: Sequence[Any], dataset: str) -> list[str]:
    """metrics.json of the main-grid cells of `dataset` (Table 3, Figs. 3–5 and 8)."""
    return [
        f"{job.path}/metrics.json"
        for job in jobs
        if job.wc["dataset"] == dataset and is_paper_cell(job.wc)
    ]


def main_datasets(jobs: Sequence[Any]) -> list[str]:
    """The datasets with main-grid cells, in `SEG_DATASETS` order."""
    return [d for d in datasets_of(jobs) if paper_metrics(jobs, d)]


def private_runs(jobs: Sequence[Any]) -> list[str]:
    """The run folders of the private jobs."""
    return [job.path for job in jobs if job.wc["eps"] != "inf"]


# What a table or figure needs of the grid to be a target.
NEEDS: dict[str, Callable[[Sequence[Any]], bool]] = {
    "paper": lambda jobs: bool(main_datasets(jobs)),
    "private": lambda jobs: bool(private_runs(jobs)),
    "sweep": lambda jobs: any(clip_overrides(job.wc["clip"]) for job in jobs),
    "quantiles": lambda jobs: any(has_quantiles(job.wc["morph"]) for job in jobs),
    "adaptive": lambda jobs: any(morph_kind(job.wc["morph"]) == "adaptive" for job in jobs),
}


@dataclass(frozen=True)
class ReportTarget:
    """The table or figure a seg report rule writes for `rule all`.

    Args:
        path: the file; with `{dataset}` (and `{figure}`, its `DATASET_FIGURE`) one per
            dataset with main-grid cells.
        needs: the `NEEDS` condition on the grid (per-dataset targets: main-grid cells).
    """

    path: str
    needs: str = "paper"

    def files(self, jobs: Sequence[Any]) -> list[str]:
        if "{dataset}" in self.path:
            return [
                self.path.format(dataset=d, figure=DATASET_FIGURE[d]) for d in main_datasets(jobs)
            ]
        return [self.path] if NEEDS[self.needs](jobs) else []


# Rule name → its target, in `rule all` order. A new table or figure: its function in
# dpmed.seg.report, its rule in rules/seg.smk, its caption and its entry here.
REPORTS: Registry[ReportTarget] = Registry("seg report")
REPORTS.add("seg_main_table", ReportTarget("results/tables/seg_main_{dataset}.csv"))
REPORTS.add("seg_clipping_figure", ReportTarget("results/figures/seg_{figure}_{dataset}.png"))
REPORTS.add("seg_training_time_figure", ReportTarget("results/measured/seg_fig8_training_time.png"))
REPORTS.add("seg_examples_figure", ReportTarget("results/figures/seg_fig1_examples.png"))
REPORTS.add("seg_visual_figure", ReportTarget("results/figures/seg_fig6_visual.png"))
REPORTS.add("seg_attack_report", ReportTarget("results/figures/seg_fig9_attack.png"))
REPORTS.add("seg_morph_effect_figure", ReportTarget("results/figures/seg_fig10_morph_effect.png"))
REPORTS.add("seg_rule_table", ReportTarget("results/tables/seg_table1_clip_rules.csv"))
REPORTS.add(
    "seg_alignment_figure", ReportTarget("results/figures/seg_fig7_alignment.png", "private")
)
REPORTS.add("seg_privacy_table", ReportTarget("results/tables/seg_privacy.csv", "private"))
REPORTS.add("seg_lr_clip_figure", ReportTarget("results/figures/seg_fig2_lr_clip.png", "sweep"))
REPORTS.add(
    "seg_quantile_table", ReportTarget("results/tables/seg_table2_quantiles.csv", "quantiles")
)
REPORTS.add(
    "seg_adaptive_figure", ReportTarget("results/figures/seg_fig11_adaptive.png", "adaptive")
)
REPORTS.add("seg_layer_figure", ReportTarget("results/figures/seg_fig12_layers.png", "adaptive"))


def targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file (with attack.json) of every job, then the tables and figures the grid
    has cells for ([] for an empty grid)."""
    runs = [f"{job.path}/{name}" for job in jobs for name in (*RUN_FILES, ATTACK_FILE)]
    return runs + [path for _, report in REPORTS.items() for path in report.files(jobs)]


def check_config(section: Mapping[str, Any], jobs: Sequence[Any]) -> None:
    """Config rules a schema cannot express: quantiles need q_low < q_high."""
    for where, params in param_sets(section):
        if "quantiles" in params:
            low, high = params["quantiles"]
            if not low < high:
                raise ConfigError(
                    f"seg.{where}.quantiles", f"need q_low < q_high, got {low}, {high}"
                )


SPEC = StudySpec(
    name="seg",
    path="results/seg/{dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}",
    axes=(
        ("datasets", "dataset"),
        ("models", "model"),
        ("clips", "clip"),
        ("morphs", "morph"),
        ("eps", "eps"),
        ("seeds", "seed"),
    ),
    patterns={
        "dataset": "|".join(SEG_DATASETS),
        "model": "|".join(SEG_MODELS),
        "clip": clip_pattern(),
        "morph": morph_pattern(),
        "eps": EPS_PATTERN,
        "seed": r"[0-9]+",
    },
    invalid=invalid,
    run_files=RUN_FILES,
    targets=targets,
    category="seg (paper 002)",
    sweep=sweep,
    wildcard_params=lambda wc: clip_overrides(str(wc["clip"])),
    check=check_config,
)
