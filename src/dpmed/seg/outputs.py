"""The seg study's outputs (paper 002): the files of every run, which runs each table and
figure reads, the registry of tables and figures that rules/report.smk generates, `rule all`'s
targets, the notes on what a grid cannot feed, and the run files the claims read. A light
module: the rule file imports it at parse time."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dpmed.data.registry import processed_files
from dpmed.errors import ConfigError
from dpmed.registry import Registry
from dpmed.report.outputs import ReportOutput, report_targets
from dpmed.seg.grid import SEG_DATASETS, attacked, clip_overrides, is_paper_cell, is_shown_cell
from dpmed.seg.morphology import has_quantiles, morph_kind, parse_morph

# The paper figure comparing the clip rules on each paper dataset (Figs. 3–5); a dataset
# registered later gets `seg_clipping_<dataset>`.
PAPER_FIGURES = {"duke": "fig3", "umn": "fig4", "covidct": "fig5"}
DATASET_FIGURE = {d: PAPER_FIGURES.get(d, "clipping") for d in SEG_DATASETS}
# Non-private diagnostics computed from the training data outside the DP mechanism: kept in
# the run's diagnostics/ folder, never to be released with a DP model (dpmed.seg.privacy).
DIAGNOSTICS = "diagnostics"
HISTORY = f"{DIAGNOSTICS}/history.csv"
MORPH_LOG = f"{DIAGNOSTICS}/morph_log.csv"
ALIGNMENT = f"{DIAGNOSTICS}/alignment.csv"
# Files every seg_train job writes into its folder, metrics.json first (the job's folder is
# that of its first output); checkpoint.pt is not among them: it is only there while a job
# runs or after it was killed. seg_attack adds ATTACK_FILE.
RUN_FILES = (
    "metrics.json",
    HISTORY,
    MORPH_LOG,
    ALIGNMENT,
    "privacy.json",
    "model.pt",
    "config.json",
)
ATTACK_FILE = "attack.json"
# Fig. 12 shows the paper's adaptive variant v2.
LAYER_VARIANT = "adaptive-v2"


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


def _plain_clip(wc: Mapping[str, str]) -> bool:
    return not clip_overrides(wc["clip"])


def _varied_quantiles(job: Any) -> bool:
    """A Table 2 cell: plain clip, batch-scope `adaptive-vN-qL-H` with (L, H) other than the
    job's configured quantiles."""
    morph, base = job.wc["morph"], tuple(float(q) for q in job.params["quantiles"])
    if not (_plain_clip(job.wc) and has_quantiles(morph)):
        return False
    spec = parse_morph(morph, base)
    return spec.scope == "batch" and spec.quantiles != base


def _default_adaptive(morph: str) -> bool:
    """An adaptive morph with the configured quantiles (no `-qL-H`; per-image `-s` or not)."""
    return morph_kind(morph) == "adaptive" and not has_quantiles(morph)


def _any_cell(test: Callable[[Mapping[str, str]], bool]) -> Callable[[Sequence[Any]], bool]:
    return lambda jobs: any(test(job.wc) for job in jobs)


@dataclass(frozen=True)
class Need:
    """What a table or figure reads of the grid: `met` tests the expanded jobs; `cells` names
    the grid entries that meet it (for the note printed when a grid has none)."""

    met: Callable[[Sequence[Any]], bool]
    cells: str


_NO_SWEEP = "a block without `sweep` whose morphs include"
# A cell the paper's qualitative figures show: plain clip rule, no or fixed morphology.
_shown_cell = _any_cell(is_shown_cell)
NEEDS: dict[str, Need] = {
    "paper": Need(
        lambda jobs: bool(main_datasets(jobs)),
        f"{_NO_SWEEP} none, <op>-k<k> or adaptive-vN (no -q/-s suffix)",
    ),
    "private": Need(lambda jobs: bool(private_runs(jobs)), "a block with a finite eps"),
    "private_paper": Need(
        _any_cell(lambda wc: is_paper_cell(wc) and wc["eps"] != "inf"),
        f"{_NO_SWEEP} none, <op>-k<k> or adaptive-vN (no -q/-s suffix), with a finite eps",
    ),
    "sweep": Need(
        _any_cell(lambda wc: bool(clip_overrides(wc["clip"]))),
        "a block with a `sweep` (clip_norm × lr)",
    ),
    "quantiles": Need(
        lambda jobs: any(_varied_quantiles(job) for job in jobs),
        f"{_NO_SWEEP} adaptive-vN-qL-H (no -s) with (L, H) other than the configured quantiles",
    ),
    "adaptive": Need(
        _any_cell(lambda wc: _plain_clip(wc) and _default_adaptive(wc["morph"])),
        f"{_NO_SWEEP} adaptive-vN or adaptive-vN-s (no -q suffix)",
    ),
    "layers": Need(
        _any_cell(lambda wc: _plain_clip(wc) and wc["morph"] == LAYER_VARIANT),
        f"{_NO_SWEEP} {LAYER_VARIANT} (no -q/-s suffix)",
    ),
    "shown": Need(_shown_cell, f"{_NO_SWEEP} none or <op>-k<k>"),
    "attacked": Need(
        lambda jobs: _shown_cell(attacked(jobs)),
        f"{_NO_SWEEP} none or <op>-k<k>, and `attack` on (the default)",
    ),
    "fixed": Need(
        _any_cell(lambda wc: _plain_clip(wc) and morph_kind(wc["morph"]) == "fixed"),
        f"{_NO_SWEEP} a fixed morphology <op>-k<k> (open, close or both)",
    ),
}


def run_files(jobs: Sequence[Any], *names: str) -> list[str]:
    """`<run>/<name>` for every job and name."""
    return [f"{job.path}/{name}" for job in jobs for name in names]


def processed_dirs(jobs: Sequence[Any]) -> dict[str, str]:
    """dataset → its processed folder, for the seg datasets with jobs."""
    return {d: f"data/processed/{d}" for d in datasets_of(jobs)}


def processed_data(jobs: Sequence[Any]) -> list[str]:
    """The processed files of the seg datasets with jobs."""
    return [f for d in datasets_of(jobs) for f in processed_files(d)]


def _dataset_param(jobs: Sequence[Any], config: Mapping[str, Any]) -> dict[str, Any]:
    return {"dataset": lambda wc: wc.dataset}


def _data_and_models(jobs: Sequence[Any]) -> dict[str, Any]:
    """The figures that run trained models on data: every model.pt, the processed data."""
    return {"_data": processed_data(jobs), "model_paths": run_files(jobs, "model.pt")}


def _processed(jobs: Sequence[Any], config: Mapping[str, Any]) -> dict[str, Any]:
    return {"processed": processed_dirs(jobs)}


_DATASET = {"dataset": "|".join(SEG_DATASETS)}
_WRITERS = "dpmed.seg.report"

# Rule name → table/figure, in `rule all` order (`dpmed.report.outputs`): a new table or figure
# is its writer in dpmed.seg.report, its entry here (`_add`, with the need it reads) and its
# caption in captions/.
REPORTS: Registry[ReportOutput] = Registry("seg report")
# Rule name → the `NEEDS` entry without which `rule all` does not ask for it.
NEED_OF: dict[str, str] = {}


def _refuse(name: str, need: str) -> Callable[[Any], list[str]]:
    def refuse(wildcards: Any) -> list[str]:
        raise ConfigError(
            "seg.grid", f"{REPORTS[name].subcategory} ({name}) needs {NEEDS[need].cells}"
        )

    return refuse


def _add(
    name: str, need: str, writer: str, files: dict[str, tuple[str, str]], label: str, **options: Any
) -> None:
    """Register table/figure rule `name` (`ReportOutput` of `writer` in dpmed.seg.report,
    `files`, `label` and `options`), asked for only when the grid meets `need`; named as a
    target of a grid that does not, its input function stops the DAG before any job runs."""
    output = ReportOutput(f"{_WRITERS}.{writer}", files, label, **options)

    def wanted(jobs: Sequence[Any]) -> list[dict[str, str]]:
        return output.wanted(jobs) if NEEDS[need].met(jobs) else []

    def inputs(jobs: Sequence[Any]) -> Mapping[str, Any]:
        return output.inputs(jobs) if NEEDS[need].met(jobs) else {"_grid": _refuse(name, need)}

    NEED_OF[name] = need
    REPORTS.add(name, replace(output, wanted=wanted, inputs=inputs))


_add(
    "seg_main_table",
    "paper",
    "main:write_main_table",
    {"csv_path": ("results/tables/seg_main_{dataset}", "seg_main")},
    "Table 3",
    inputs=lambda jobs: {"metrics_paths": lambda wc: paper_metrics(jobs, wc.dataset)},
    params=_dataset_param,
    wanted=lambda jobs: [{"dataset": d} for d in main_datasets(jobs)],
    constraints=_DATASET,
)
_add(
    "seg_clipping_figure",
    "paper",
    "main:clipping_figure",
    {"png_path": ("results/figures/seg_{fig}_{dataset}", "seg_clipping")},
    "Figs. 3-5",
    inputs=lambda jobs: {"metrics_paths": lambda wc: paper_metrics(jobs, wc.dataset)},
    params=_dataset_param,
    wanted=lambda jobs: [{"fig": DATASET_FIGURE[d], "dataset": d} for d in main_datasets(jobs)],
    constraints={"fig": "|".join(dict.fromkeys(DATASET_FIGURE.values())), **_DATASET},
)
_add(
    "seg_training_time_figure",
    "paper",
    "main:training_time_figure",
    {"png_path": ("results/measured/seg_fig8_training_time", "seg_fig8")},
    "Fig. 8",
    inputs=lambda jobs: {
        "metrics_paths": [f for d in main_datasets(jobs) for f in paper_metrics(jobs, d)]
    },
)
_add(
    "seg_examples_figure",
    "paper",
    "visual:examples_figure",
    {"png_path": ("results/figures/seg_fig1_examples", "seg_fig1")},
    "Fig. 1",
    inputs=lambda jobs: {"_data": processed_data(jobs)},
    params=lambda jobs, config: {"processed_dirs": processed_dirs(jobs)},
)
_add(
    "seg_visual_figure",
    "shown",
    "visual:visual_figure",
    {"png_path": ("results/figures/seg_fig6_visual", "seg_fig6")},
    "Fig. 6",
    inputs=_data_and_models,
    params=_processed,
)
_add(
    "seg_attack_report",
    "attacked",
    "attack:attack_report",
    {
        "png_path": ("results/figures/seg_fig9_attack", "seg_fig9"),
        "csv_path": ("results/tables/seg_attack", "seg_attack"),
    },
    "Fig. 9",
    inputs=lambda jobs: {"attack_paths": run_files(attacked(jobs), ATTACK_FILE)},
)
_add(
    "seg_morph_effect_figure",
    "fixed",
    "visual:morph_effect_figure",
    {"png_path": ("results/figures/seg_fig10_morph_effect", "seg_fig10")},
    "Fig. 10",
    inputs=_data_and_models,
    params=_processed,
)
_add(
    "seg_rule_table",
    "paper",
    "privacy:write_clip_rule_table",
    {"csv_path": ("results/tables/seg_table1_clip_rules", "seg_table1")},
    "Table 1",
)
_add(
    "seg_alignment_figure",
    "private_paper",
    "alignment:alignment_figure",
    {"png_path": ("results/figures/seg_fig7_alignment", "seg_fig7")},
    "Fig. 7",
    inputs=lambda jobs: {"alignment_paths": [f"{run}/{ALIGNMENT}" for run in private_runs(jobs)]},
)
_add(
    "seg_privacy_table",
    "private",
    "privacy:write_seg_privacy_table",
    {"csv_path": ("results/tables/seg_privacy", "seg_privacy")},
    "sound vs paper",
    inputs=lambda jobs: {"privacy_paths": run_files(jobs, "privacy.json")},
)
_add(
    "seg_lr_clip_figure",
    "sweep",
    "ablation:lr_clip_report",
    {
        "png_path": ("results/figures/seg_fig2_lr_clip", "seg_fig2"),
        "csv_path": ("results/tables/seg_fig2_lr_clip", "seg_fig2_table"),
    },
    "Fig. 2",
    inputs=lambda jobs: {"metrics_paths": run_files(jobs, "metrics.json")},
)
_add(
    "seg_quantile_table",
    "quantiles",
    "ablation:write_quantile_table",
    {"csv_path": ("results/tables/seg_table2_quantiles", "seg_table2")},
    "Table 2",
    inputs=lambda jobs: {"metrics_paths": run_files(jobs, "metrics.json")},
    params=lambda jobs, config: {"quantiles": config["seg"]["defaults"]["quantiles"]},
)
_add(
    "seg_adaptive_figure",
    "adaptive",
    "adaptive:adaptive_figure",
    {"png_path": ("results/figures/seg_fig11_adaptive", "seg_fig11")},
    "Fig. 11",
    inputs=lambda jobs: {"metrics_paths": run_files(jobs, "metrics.json")},
)
_add(
    "seg_layer_figure",
    "layers",
    "adaptive:layer_figure",
    {"png_path": ("results/figures/seg_fig12_layers", "seg_fig12")},
    "Fig. 12",
    inputs=lambda jobs: {"_runs": run_files(jobs, HISTORY, MORPH_LOG)},
    params=lambda jobs, config: {"run_dirs": [job.path for job in jobs]},
)
_add(
    "seg_privacy_utility_figure",
    "private_paper",
    "main:privacy_utility_report",
    {
        "png_path": ("results/figures/seg_privacy_utility", "seg_privacy_utility"),
        "csv_path": ("results/tables/seg_privacy_utility", "seg_privacy_utility"),
    },
    "privacy vs utility",
    inputs=lambda jobs: {
        "metrics_paths": [f for d in main_datasets(jobs) for f in paper_metrics(jobs, d)]
    },
)


def targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job, attack.json of the attacked ones, then the tables and
    figures the grid has cells for ([] for an empty grid)."""
    runs = run_files(jobs, *RUN_FILES) + run_files(attacked(jobs), ATTACK_FILE)
    return runs + report_targets(REPORTS, jobs)


def notes(jobs: Sequence[Any]) -> list[str]:
    """Per need the grid does not meet: the tables and figures `rule all` leaves out and the
    grid entry they need ([] for an empty grid)."""
    if not jobs:
        return []
    out = []
    for need, entry in NEEDS.items():
        names = [name for name, of in NEED_OF.items() if of == need]
        if names and not entry.met(jobs):
            made = ", ".join(f"{REPORTS[name].subcategory} ({name})" for name in names)
            out.append(f"seg {made}: not made; needs {entry.cells}")
    return out


def claims_inputs(jobs: Sequence[Any]) -> dict[str, list[str]]:
    """The run files the seg claims (`dpmed.seg.claims`) are judged on."""
    return {
        "metrics_paths": run_files(jobs, "metrics.json"),
        "attack_paths": run_files(attacked(jobs), ATTACK_FILE),
        "alignment_paths": [f"{run}/{ALIGNMENT}" for run in private_runs(jobs)],
    }
