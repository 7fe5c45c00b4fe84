"""The seg study's grid and outputs (paper 002): axes, validity, wildcard patterns (from the clip
rule, morphology and model registries), the clip wildcard's sweep suffix, run files, and the
tables and figures `rule all` asks for. A light module: the rule file imports it at parse time.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dpmed.config.study import (
    ClaimSource,
    StudyAudit,
    StudySpec,
    SweepResult,
    Wildcards,
    block_params,
    param_key,
    param_sets,
)
from dpmed.config.wildcards import EPS_PATTERN, NUMBER_PATTERN, format_eps
from dpmed.data.registry import processed_files
from dpmed.errors import ConfigError
from dpmed.models import MODELS, models_of_kind
from dpmed.privacy.clipping import CLIP_RULES
from dpmed.registry import Registry
from dpmed.report.outputs import ReportOutput, report_targets
from dpmed.seg.morphology import (
    has_quantiles,
    is_plain,
    morph_kind,
    morph_pattern,
    parse_morph,
    unsupported,
)

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
# Fig. 12 shows the paper's adaptive variant v2 (= dpmed.seg.report.adaptive.LAYER_VARIANT).
LAYER_VARIANT = "adaptive-v2"
# Models that need at least three down-sampling stages (Inf-Net: three high-level features).
MIN_DEPTH = {"infnet": 3}


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
_shown_cell = _any_cell(lambda wc: _plain_clip(wc) and morph_kind(wc["morph"]) != "adaptive")
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


def attacked(jobs: Sequence[Any]) -> list[Any]:
    """The jobs the membership attack scores: those of blocks with `attack: true` (the default;
    `attack: false` leaves, e.g., a demo's too-short coverage runs unscored)."""
    return [job for job in jobs if job.switches.get("attack", True)]


def run_files(jobs: Sequence[Any], *names: str) -> list[str]:
    """`<run>/<name>` for every job and name."""
    return [f"{job.path}/{name}" for job in jobs for name in names]


def processed_dirs(jobs: Sequence[Any]) -> dict[str, str]:
    """dataset → its processed folder, for the seg datasets with jobs."""
    return {d: f"data/processed/{d}" for d in datasets_of(jobs)}


def processed_data(jobs: Sequence[Any]) -> list[str]:
    """The processed files of the seg datasets with jobs."""
    return [f for d in datasets_of(jobs) for f in processed_files(d)]


def _per_main_dataset(jobs: Sequence[Any]) -> list[dict[str, str]]:
    return [{"fig": DATASET_FIGURE[d], "dataset": d} for d in main_datasets(jobs)]


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
# caption in workflow/report/.
REPORTS: Registry[ReportOutput] = Registry("seg report")
# Rule name → the `NEEDS` entry without which `rule all` does not ask for it.
NEED_OF: dict[str, str] = {}


def _refuse(name: str, need: str) -> Callable[[Any], list[str]]:
    def refuse(wildcards: Any) -> list[str]:
        raise ConfigError(
            "seg.grid", f"{REPORTS[name].subcategory} ({name}) needs {NEEDS[need].cells}"
        )

    return refuse


def _add(name: str, need: str, output: ReportOutput) -> None:
    """Register table/figure rule `name`, asked for only when the grid meets `need`; named as
    a target of a grid that does not, its input function stops the DAG before any job runs."""

    def wanted(jobs: Sequence[Any]) -> list[dict[str, str]]:
        return output.wanted(jobs) if NEEDS[need].met(jobs) else []

    def inputs(jobs: Sequence[Any]) -> Mapping[str, Any]:
        return output.inputs(jobs) if NEEDS[need].met(jobs) else {"_grid": _refuse(name, need)}

    NEED_OF[name] = need
    REPORTS.add(name, replace(output, wanted=wanted, inputs=inputs))


_add(
    "seg_main_table",
    "paper",
    ReportOutput(
        f"{_WRITERS}.main:write_main_table",
        {"csv_path": ("results/tables/seg_main_{dataset}", "seg_main")},
        "Table 3",
        inputs=lambda jobs: {"metrics_paths": lambda wc: paper_metrics(jobs, wc.dataset)},
        params=_dataset_param,
        wanted=lambda jobs: [{"dataset": d} for d in main_datasets(jobs)],
        constraints=_DATASET,
    ),
)
_add(
    "seg_clipping_figure",
    "paper",
    ReportOutput(
        f"{_WRITERS}.main:clipping_figure",
        {"png_path": ("results/figures/seg_{fig}_{dataset}", "seg_clipping")},
        "Figs. 3-5",
        inputs=lambda jobs: {"metrics_paths": lambda wc: paper_metrics(jobs, wc.dataset)},
        params=_dataset_param,
        wanted=_per_main_dataset,
        constraints={"fig": "|".join(DATASET_FIGURE.values()), **_DATASET},
    ),
)
_add(
    "seg_training_time_figure",
    "paper",
    ReportOutput(
        f"{_WRITERS}.main:training_time_figure",
        {"png_path": ("results/measured/seg_fig8_training_time", "seg_fig8")},
        "Fig. 8",
        inputs=lambda jobs: {
            "metrics_paths": [f for d in main_datasets(jobs) for f in paper_metrics(jobs, d)]
        },
    ),
)
_add(
    "seg_examples_figure",
    "paper",
    ReportOutput(
        f"{_WRITERS}.visual:examples_figure",
        {"png_path": ("results/figures/seg_fig1_examples", "seg_fig1")},
        "Fig. 1",
        inputs=lambda jobs: {"_data": processed_data(jobs)},
        params=lambda jobs, config: {"processed_dirs": processed_dirs(jobs)},
    ),
)
_add(
    "seg_visual_figure",
    "shown",
    ReportOutput(
        f"{_WRITERS}.visual:visual_figure",
        {"png_path": ("results/figures/seg_fig6_visual", "seg_fig6")},
        "Fig. 6",
        inputs=_data_and_models,
        params=_processed,
    ),
)
_add(
    "seg_attack_report",
    "attacked",
    ReportOutput(
        f"{_WRITERS}.attack:attack_report",
        {
            "png_path": ("results/figures/seg_fig9_attack", "seg_fig9"),
            "csv_path": ("results/tables/seg_attack", "seg_attack"),
        },
        "Fig. 9",
        inputs=lambda jobs: {"attack_paths": run_files(attacked(jobs), ATTACK_FILE)},
    ),
)
_add(
    "seg_morph_effect_figure",
    "fixed",
    ReportOutput(
        f"{_WRITERS}.visual:morph_effect_figure",
        {"png_path": ("results/figures/seg_fig10_morph_effect", "seg_fig10")},
        "Fig. 10",
        inputs=_data_and_models,
        params=_processed,
    ),
)
_add(
    "seg_rule_table",
    "paper",
    ReportOutput(
        f"{_WRITERS}.privacy:write_clip_rule_table",
        {"csv_path": ("results/tables/seg_table1_clip_rules", "seg_table1")},
        "Table 1",
    ),
)
_add(
    "seg_alignment_figure",
    "private_paper",
    ReportOutput(
        f"{_WRITERS}.alignment:alignment_figure",
        {"png_path": ("results/figures/seg_fig7_alignment", "seg_fig7")},
        "Fig. 7",
        inputs=lambda jobs: {
            "alignment_paths": [f"{run}/{ALIGNMENT}" for run in private_runs(jobs)]
        },
    ),
)
_add(
    "seg_privacy_table",
    "private",
    ReportOutput(
        f"{_WRITERS}.privacy:write_seg_privacy_table",
        {"csv_path": ("results/tables/seg_privacy", "seg_privacy")},
        "sound vs paper",
        inputs=lambda jobs: {"privacy_paths": run_files(jobs, "privacy.json")},
    ),
)
_add(
    "seg_lr_clip_figure",
    "sweep",
    ReportOutput(
        f"{_WRITERS}.ablation:lr_clip_report",
        {
            "png_path": ("results/figures/seg_fig2_lr_clip", "seg_fig2"),
            "csv_path": ("results/tables/seg_fig2_lr_clip", "seg_fig2_table"),
        },
        "Fig. 2",
        inputs=lambda jobs: {"metrics_paths": run_files(jobs, "metrics.json")},
    ),
)
_add(
    "seg_quantile_table",
    "quantiles",
    ReportOutput(
        f"{_WRITERS}.ablation:write_quantile_table",
        {"csv_path": ("results/tables/seg_table2_quantiles", "seg_table2")},
        "Table 2",
        inputs=lambda jobs: {"metrics_paths": run_files(jobs, "metrics.json")},
        params=lambda jobs, config: {"quantiles": config["seg"]["defaults"]["quantiles"]},
    ),
)
_add(
    "seg_adaptive_figure",
    "adaptive",
    ReportOutput(
        f"{_WRITERS}.adaptive:adaptive_figure",
        {"png_path": ("results/figures/seg_fig11_adaptive", "seg_fig11")},
        "Fig. 11",
        inputs=lambda jobs: {"metrics_paths": run_files(jobs, "metrics.json")},
    ),
)
_add(
    "seg_layer_figure",
    "layers",
    ReportOutput(
        f"{_WRITERS}.adaptive:layer_figure",
        {"png_path": ("results/figures/seg_fig12_layers", "seg_fig12")},
        "Fig. 12",
        inputs=lambda jobs: {"_runs": run_files(jobs, HISTORY, MORPH_LOG)},
        params=lambda jobs, config: {"run_dirs": [job.path for job in jobs]},
    ),
)

_add(
    "seg_privacy_utility_figure",
    "private_paper",
    ReportOutput(
        f"{_WRITERS}.privacy_utility:privacy_utility_report",
        {
            "png_path": ("results/figures/seg_privacy_utility", "seg_privacy_utility"),
            "csv_path": ("results/tables/seg_privacy_utility", "seg_privacy_utility"),
        },
        "privacy vs utility",
        inputs=lambda jobs: {
            "metrics_paths": [f for d in main_datasets(jobs) for f in paper_metrics(jobs, d)]
        },
    ),
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


def _check_block(config: Mapping[str, Any], index: int) -> None:
    section = config["seg"]
    block, params = section["grid"][index], block_params(section, index)
    where = f"seg.grid[{index}]"
    for morph in block["morphs"]:
        try:
            parse_morph(morph, tuple(params["quantiles"]))
        except ValueError as err:
            raise ConfigError(f"{where}.morphs", str(err)) from None
    depth, depth_key = int(params["depth"]), param_key("seg", section, index, "depth")
    for model in block["models"]:
        least = MIN_DEPTH.get(model, 1)
        if depth < least:
            raise ConfigError(
                depth_key,
                f"{MODELS[model].label} ({where}.models) needs depth ≥ {least}, got {depth}",
            )
    for dataset in block["datasets"]:
        size = config["data"][dataset]["size"]
        if any(side % 2**depth for side in size):
            raise ConfigError(
                depth_key,
                f"depth {depth} halves the image {depth} times, so the sides of "
                f"data.{dataset}.size {size} ({where}) must divide by 2^{depth} = {2**depth}",
            )
    weights = params.get("backbone_weights")
    if weights is not None and "infnet" in block["models"] and not Path(weights).is_file():
        raise ConfigError(
            param_key("seg", section, index, "backbone_weights"), f"no file '{weights}'"
        )


def check_config(config: Mapping[str, Any], jobs: Sequence[Any]) -> None:
    """Config rules a schema cannot express: quantiles need q_low < q_high; every morph of a
    block parses (a `-qL-H` suffix needs 0 ≤ L ≤ H ≤ 100); each block's depth suits its models
    and the image size of its datasets (sides divisible by 2^depth); Inf-Net's local backbone
    weights exist."""
    for where, params in param_sets(config["seg"]):
        if "quantiles" in params:
            low, high = params["quantiles"]
            if not low < high:
                raise ConfigError(
                    f"seg.{where}.quantiles", f"need q_low < q_high, got {low}, {high}"
                )
    for index in range(len(config["seg"]["grid"])):
        _check_block(config, index)


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
    switches={"attack": True},
    reports=REPORTS,
    notes=notes,
    paired=("dataset", "model", "seed"),
    rules="rules/seg.smk",
    sizing="dpmed.seg.sizing:SIZING",
    probe="dpmed.seg.probe:PROBE",
    audit=StudyAudit(("gradient", "input", "paper-noise"), "dpmed.seg.audit:audit_cell"),
    claims=ClaimSource(
        "dpmed.seg.claims:seg_observations",
        lambda jobs: {
            "metrics_paths": run_files(jobs, "metrics.json"),
            "attack_paths": run_files(attacked(jobs), ATTACK_FILE),
            "alignment_paths": [f"{run}/{ALIGNMENT}" for run in private_runs(jobs)],
        },
    ),
)


def forward_batch_size(params: Mapping[str, Any]) -> int:
    """Images per evaluation forward pass: `batch_size`, or `physical_batch` where smaller.

    A memory bound like training's chunks: without DP-Morph, and with fixed or per-image
    DP-Morph, an image's output does not depend on the others in its pass (batch-adaptive
    DP-Morph cannot run with `physical_batch`: `dpmed.seg.run.Plan`).
    """
    batch, physical = int(params["batch_size"]), params.get("physical_batch")
    return batch if physical is None else min(batch, int(physical))
