"""Paper 002 Fig. 9 (protection of the clipping rules against the global-loss attack) and its
table, from the runs' attack.json files (`dpmed.seg.attack`).

Table: one row per (dataset, model, clip, morph, eps) of every run given (sweep and ablation
cells included): `n_seeds`, and per metric (AUC, balanced accuracy, advantage, TPR at FPR 1 % /
0.1 %) the mean over seeds with its 95 % t-interval over seeds (`<m>_mean`, `<m>_ci_low`,
`<m>_ci_high`, `dpmed.report.intervals.summarize`). The threshold-free metrics (AUC, TPR at low
FPR) also get a 95 % percentile bootstrap interval over evaluation images (`<m>_boot_low`,
`<m>_boot_high`): members and non-members of each seed resampled separately, the statistic
averaged over the cell's seeds, B = `BOOTSTRAP_RESAMPLES`, fixed seed `BOOTSTRAP_SEED`), and a
95 % two-stage bootstrap interval over seeds, then images (`<m>_seedboot_low`,
`<m>_seedboot_high`, `dpmed.report.intervals.seed_bootstrap_interval`): the one whose width
includes the variation between training runs, NaN with one seed.
`auc_p_vs_flat`: paired t-test over seeds of the AUC against flat clipping in the same
(dataset, model, morph, ε) (NaN for flat itself and below two paired seeds).
Figure: one panel per dataset, (a) Duke (b) UMN (c) COVID-19 lung CT as present; the paper's
cells only (a plain clip rule, morph none or a fixed variant, no -q/-s suffix); per model (and
fixed morph variant) one bar per clip rule and ε: balanced accuracy at the calibrated threshold
(mean over seeds, its interval as error bar: `dpmed.report.intervals.error_bars`, within
[0, 1]; none from fewer than 3 seeds, whose count is written instead), AUC as a marker,
chance (0.5) dashed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dpmed.config.wildcards import parse_eps
from dpmed.data.registry import dataset_label
from dpmed.errors import DataFormatError
from dpmed.metrics.membership import THRESHOLD_FREE
from dpmed.privacy.clipping import CLIP_RULES, report_order
from dpmed.report.intervals import (
    INTERVAL_METHOD,
    bootstrap_interval,
    error_bars,
    paired_tests,
    seed_bootstrap_interval,
    summarize,
)
from dpmed.report.style import note_seeds, save_figure, write_table
from dpmed.seg.grid import SEG_DATASETS, clip_rule, is_shown_cell
from dpmed.seg.report.labels import clip_label, model_label, model_order

METRICS = ("auc", "balanced_accuracy", "advantage", "tpr_at_fpr_1pct", "tpr_at_fpr_0.1pct")
CELL = ["dataset", "model", "clip", "morph", "eps"]
HATCHES = ("", "//", "..", "xx", "\\\\")
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
BASELINE_CLIP = "flat"


def collect_attacks(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per attack.json: its wildcards, metrics and per-image evaluation scores
    (`members`, `nonmembers`: float arrays)."""
    rows = []
    for path in paths:
        result = json.loads(Path(path).read_text())
        if "evaluation_scores" not in result:
            raise DataFormatError(
                path,
                "no per-image `evaluation_scores` (written by an older dpmed): rerun this "
                "attack, e.g. `snakemake --forcerun seg_attack`, so the table can bootstrap",
            )
        scores = result["evaluation_scores"]
        rows.append(
            dict(result["wildcards"])
            | {k: float(result[k]) for k in METRICS}
            | {side: np.asarray(scores[side], dtype=float) for side in ("members", "nonmembers")}
        )
    if not rows:
        raise ValueError("no attack.json files given")
    return pd.DataFrame(rows)


def _order(row: pd.Series) -> tuple:
    datasets = SEG_DATASETS
    return (
        datasets.index(row["dataset"]) if row["dataset"] in datasets else len(datasets),
        row["dataset"],
        model_order().index(row["model"]),
        report_order().index(clip_rule(row["clip"])),
        row["clip"],
        row["morph"],
        parse_eps(row["eps"]),
    )


def attack_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and 95 % t-interval over seeds per cell; of the threshold-free metrics, bootstrap
    intervals over images and over seeds then images; paired p of the AUC against flat
    clipping; in paper order."""
    runs = runs.assign(seed=runs["seed"].astype(int))
    table = summarize(runs, CELL, METRICS)
    cells = [
        list(zip(cell["members"], cell["nonmembers"], strict=True))
        for _, cell in runs.groupby(CELL, sort=False)
    ]
    for name, statistic in THRESHOLD_FREE.items():
        at = table.columns.get_loc(f"{name}_ci_high") + 1
        for kind, interval in (("boot", bootstrap_interval), ("seedboot", seed_bootstrap_interval)):
            bounds = [
                interval(cell, statistic, BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED)
                for cell in cells
            ]
            table.insert(at, f"{name}_{kind}_low", [b[0] for b in bounds])
            table.insert(at + 1, f"{name}_{kind}_high", [b[1] for b in bounds])
            at += 2
    tests = paired_tests(runs, ["dataset", "model", "morph", "eps"], "clip", BASELINE_CLIP, ["auc"])
    table = table.merge(tests, on=CELL, how="left", validate="one_to_one")
    order = sorted(range(len(table)), key=lambda i: _order(table.iloc[i]))
    return table.iloc[order].reset_index(drop=True)


def figure_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """Per paper cell of `collect_attacks` rows: `n_seeds`, mean AUC, mean balanced accuracy
    and its error bar (`ba_below`, `ba_above`: `error_bars` within [0, 1])."""
    runs = runs[[is_shown_cell(wc) for wc in runs[CELL].to_dict("records")]]
    rows = []
    for key, cell in runs.groupby(CELL, sort=False):
        mean, below, above = error_bars(cell["balanced_accuracy"])
        rows.append(dict(zip(CELL, key, strict=True)) | {
            "n_seeds": len(cell), "auc_mean": cell["auc"].mean(),
            "balanced_accuracy_mean": mean, "ba_below": below, "ba_above": above,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=[*CELL, "n_seeds", "auc_mean", "balanced_accuracy_mean",
                                       "ba_below", "ba_above"])  # fmt: skip


def attack_figure(runs: pd.DataFrame, png_path: str | Path) -> None:
    """Fig. 9 from `collect_attacks` rows (paper cells only, `figure_cells`); one legend for
    all panels (colour = clip rule, hatch = ε rank of that rule over the figure)."""
    cells = figure_cells(runs)
    if cells.empty:
        raise ValueError("no attack results of paper cells (plain clip, morph none or fixed)")
    series = _sorted_series(cells)
    datasets = [d for d in SEG_DATASETS if d in set(cells["dataset"])]
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.2), squeeze=False)
    for index, (ax, dataset) in enumerate(zip(axes[0], datasets, strict=True)):
        _panel(ax, cells[cells["dataset"] == dataset], series)
        ax.set_title(f"({'abc'[index]}) {dataset_label(dataset)}")
    axes[0, 0].set_ylabel("attack success (balanced accuracy)")
    handles: dict[str, object] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    order = ["AUC", "chance"] + [_series_label(c, e) for c, e in series]
    labels = [label for label in order if label in handles]
    fig.legend(
        [handles[k] for k in labels],
        labels,
        loc="lower center",
        ncol=len(labels),
        fontsize=8,
        bbox_to_anchor=(0.5, -0.08),
    )
    fig.suptitle(
        "Global-loss membership attack per clipping rule (bars: balanced accuracy at the "
        f"calibrated threshold, mean; diamonds: mean AUC)\n{INTERVAL_METHOD}",
        fontsize=9,
    )
    fig.subplots_adjust(top=0.8)  # the two-line title clear of the panel titles
    save_figure(fig, png_path)


def _sorted_series(cells: pd.DataFrame) -> list[tuple[str, str]]:
    """The (clip, eps) pairs present, clip rules in paper order, then ε ascending."""
    return sorted(
        set(zip(cells["clip"], cells["eps"], strict=True)),
        key=lambda s: (report_order().index(s[0]), parse_eps(s[1])),
    )


def _series_label(clip: str, eps: str) -> str:
    return clip_label(clip) + (f" (ε={eps})" if CLIP_RULES[clip].bounded else "")


def _panel(ax: plt.Axes, cells: pd.DataFrame, all_series: list[tuple[str, str]]) -> None:
    groups = sorted(
        set(zip(cells["model"], cells["morph"], strict=True)),
        key=lambda g: (model_order().index(g[0]), g[1] != "none", g[1]),
    )
    series = _sorted_series(cells)
    width = 0.8 / len(series)
    x = np.arange(len(groups))
    colors = plt.get_cmap("tab10")
    for i, (clip, eps) in enumerate(series):
        rows = cells[(cells["clip"] == clip) & (cells["eps"] == eps)]
        by_group = {(r.model, r.morph): r for r in rows.itertuples(index=False)}
        picked = [by_group.get(g) for g in groups]
        ba = [np.nan if r is None else r.balanced_accuracy_mean for r in picked]
        none = (np.nan, np.nan)  # below and above the mean: no interval drawn
        err = np.array([none if r is None else (r.ba_below, r.ba_above) for r in picked]).T
        auc = [np.nan if r is None else r.auc_mean for r in picked]
        offset = x + (i - (len(series) - 1) / 2) * width
        eps_rank = [e for c, e in all_series if c == clip].index(eps)
        ax.bar(
            offset,
            ba,
            width,
            yerr=err,
            capsize=2,
            label=_series_label(clip, eps),
            color=colors(report_order().index(clip)),
            hatch=HATCHES[eps_rank % len(HATCHES)],
            edgecolor="white",
        )
        note_seeds(ax, offset, ba, [0 if r is None else r.n_seeds for r in picked])
        ax.plot(offset, auc, "D", color="black", markersize=4, label="AUC")
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1, label="chance")
    names = [model_label(m) + ("" if morph == "none" else f"\n{morph}") for m, morph in groups]
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylim(0, 1.05)


def attack_report(
    attack_paths: Iterable[str | Path], png_path: str | Path, csv_path: str | Path
) -> pd.DataFrame:
    """Write the table (csv + md) of every run and the Fig. 9 figure (png + pdf)."""
    runs = collect_attacks(attack_paths)
    table = attack_table(runs)
    write_table(table, csv_path)
    attack_figure(runs, png_path)
    return table
