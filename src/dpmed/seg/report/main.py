"""Tables and figures of the seg study (paper 002: Table 3, Figs. 3–5 and 8) from the runs'
metrics.json files — only the cells the grid actually ran.

Table rows (`main_table`), per model: setting × method as in the paper's Table 3:
  Non-private: No Morph, Morph (<op>-k<k>) for each fixed variant, Adaptive Morph (vN);
  DP (no morph) / DP + Morph (<op>-k<k>) / DP + Adaptive Morph (vN): one row per clip rule.
Every fixed variant is its own row (the paper keeps only the best one; choosing on the test
set would be optimistic). Values are the mean over seeds with its 95 % t-interval (`<m>_mean`,
`<m>_ci_low`, `<m>_ci_high`, `n_seeds`; empty bounds with one seed), and `dice_p_vs_flat` the
paired t-test over seeds of a clip rule's Dice against flat clipping in the same cell.
HD95 is paper 002 Eq. (3) (`dpmed.metrics.segmentation.hd95`, pixels);
`hd95_empty` / `hd95_both_empty` sum over seeds the (image, class) pairs scored by the empty
rule (exactly one mask empty → image diagonal; both empty → 0). Figs. 3–5: bars of test Dice
(and HD95 for OCT, S_α for COVID CT) per clip rule, without morphology vs the fixed morphology
variant with the best mean *validation* Dice for that model and rule (its name on the bar).
Fig. 8: mean training seconds per model and rule for no / fixed / adaptive morphology.
Privacy vs utility: test Dice against the target ε for every method of the main grid, one panel
per dataset × model, mean over seeds with the 95 % t-interval; the non-private methods (ε = ∞)
as reference lines (`dpmed.report.privacy_utility`), the plotted values beside it as a table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dpmed.config.wildcards import parse_eps
from dpmed.data.registry import dataset_label
from dpmed.privacy.clipping import report_order
from dpmed.report import privacy_utility
from dpmed.report.intervals import INTERVAL_METHOD, UNIT, error_bars, paired_tests, summarize
from dpmed.report.style import (
    grey_unlearned,
    label_bars,
    legend_handles,
    note_seeds,
    save_figure,
    write_table,
)
from dpmed.seg.claims import LEARNED_DICE
from dpmed.seg.grid import SEG_DATASETS, STRUCTURE_DATASETS
from dpmed.seg.morphology import MORPH_KINDS, morph_kind, parse_morph
from dpmed.seg.report.labels import clip_label, model_label, model_order

METRICS = ("dice", "hd95", "mae", "s_alpha", "e_phi")
COLUMN = {"dice": "Dice", "hd95": "HD95", "mae": "MAE", "s_alpha": "S_alpha", "e_phi": "E_phi"}
BASELINE_CLIP = "flat"  # the clip rule the others are tested against (paired over seeds)
SETTING_ORDER = ("Non-private", "DP (no morph)", "DP + Morph")  # then DP + Adaptive Morph (vN)


def collect_runs(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per run: wildcards, test metrics, val Dice, training seconds."""
    rows = []
    for path in paths:
        m = json.loads(Path(path).read_text())
        row = dict(m["wildcards"])
        for key in (*METRICS, "val_dice", "train_seconds", "hd95_empty", "hd95_both_empty"):
            value = m.get(key)
            row[key] = math.nan if value is None else value
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        raise ValueError("no seg runs given")
    order = ["dataset", "model", "clip", "morph", "eps", "seed"]
    return frame.sort_values(order).reset_index(drop=True)


def setting_method(clip: str, morph: str) -> tuple[str, str]:
    """Table 3's (setting, method) labels of a cell."""
    kind = morph_kind(morph)
    version = parse_morph(morph).variant if kind == "adaptive" else ""
    if clip == "none":
        method = {
            "none": "No Morph",
            "fixed": f"Morph ({morph})",
            "adaptive": f"Adaptive Morph ({version})",
        }
        return "Non-private", method[kind]
    setting = {
        "none": "DP (no morph)",
        "fixed": "DP + Morph",
        "adaptive": f"DP + Adaptive Morph ({version})",
    }
    method = clip_label(clip) + (f" ({morph})" if kind == "fixed" else "")
    return setting[kind], method


def _fmt(mean: float, low: float, n: int) -> str:
    """'mean ± half-width of the 95 % t-interval', or 'mean (n=1)' without an interval."""
    if math.isnan(mean):
        return ""
    return f"{mean:.4f} ± {mean - low:.4f}" if n > 1 else f"{mean:.4f} (n=1)"


def main_table(runs: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Table 3 layout for `dataset`: model × setting × method; per metric the mean over seeds
    and its 95 % t-interval (`dpmed.report.intervals.summarize`, text column 'mean ±
    half-width'), and the paired t-test over seeds of each clip rule's Dice against flat
    clipping at the same model, morphology and ε (`dice_p_vs_flat`)."""
    sub = runs[runs["dataset"] == dataset]
    if sub.empty:
        raise ValueError(f"no seg runs of dataset '{dataset}'")
    structure = ["s_alpha", "e_phi"] if dataset in STRUCTURE_DATASETS else []
    metrics = ["dice", "hd95", "mae", *structure]
    cell = ["model", "clip", "morph", "eps"]
    sub = sub.assign(seed=sub["seed"].astype(int))
    table = summarize(sub, cell, metrics)
    empty = sub.groupby(cell, sort=False)[["hd95_empty", "hd95_both_empty"]].sum()
    table = table.join(empty.astype(int), on=cell)
    tests = paired_tests(sub, ["model", "morph", "eps"], "clip", BASELINE_CLIP, ["dice"])
    table = table.merge(tests, on=cell, how="left", validate="one_to_one")
    labels = [setting_method(c, m) for c, m in zip(table["clip"], table["morph"], strict=True)]
    table.insert(0, "model_label", [model_label(m) for m in table["model"]])
    table.insert(1, "setting", [label[0] for label in labels])
    table.insert(2, "method", [label[1] for label in labels])
    for at, name in enumerate(metrics, start=table.columns.get_loc("n_seeds") + 1):
        text = [
            _fmt(mean, low, n)
            for mean, low, n in zip(
                table[f"{name}_mean"], table[f"{name}_ci_low"], table["n_seeds"], strict=True
            )
        ]
        table.insert(at, COLUMN[name], text)
    models, clips = model_order(), report_order()
    order = [
        (
            models.index(model),
            setting != "Non-private",
            SETTING_ORDER.index(setting) if setting in SETTING_ORDER else len(SETTING_ORDER),
            MORPH_KINDS.index(morph_kind(morph)),
            clips.index(clip),
            morph,
        )
        for model, setting, clip, morph in zip(
            table["model"], table["setting"], table["clip"], table["morph"], strict=True
        )
    ]
    table = table.iloc[sorted(range(len(table)), key=order.__getitem__)]
    table = table.drop(columns="model").rename(columns={"model_label": "model"})
    return table.reset_index(drop=True)


def write_main_table(
    metrics_paths: Iterable[str | Path], dataset: str, csv_path: str | Path
) -> None:
    write_table(main_table(collect_runs(metrics_paths), dataset), csv_path)


BOUNDS = {"dice": UNIT, "hd95": None, "s_alpha": UNIT}  # the drawn metrics' ranges


def _cell_means(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (model, clip, morph): seeds `n`, the drawn metrics' means and error bars
    (`<m>_below`, `<m>_above`: `error_bars` within the metric's range), val Dice, seconds."""
    cols = ["model", "clip", "morph"]
    bars = {
        f"{m}_{side}": (m, lambda v, b=bounds, i=i: error_bars(v, b)[i])
        for m, bounds in BOUNDS.items()
        for i, side in ((1, "below"), (2, "above"))
    }
    return (
        runs.groupby(cols, sort=False)
        .agg(
            n=("dice", "size"),
            dice=("dice", "mean"),
            hd95=("hd95", "mean"),
            s_alpha=("s_alpha", "mean"),
            val_dice=("val_dice", "mean"),
            seconds=("train_seconds", "mean"),
            **bars,
        )
        .reset_index()
    )


def clipping_figure(
    metrics_paths: Iterable[str | Path], dataset: str, png_path: str | Path
) -> None:
    """Figs. 3–5: per model, clip rules × (no morph, best fixed morph by validation Dice)."""
    runs = collect_runs(metrics_paths)
    cells = _cell_means(runs[runs["dataset"] == dataset])
    models = [m for m in model_order() if m in set(cells["model"])]
    second = "s_alpha" if dataset in STRUCTURE_DATASETS else "hd95"
    labels = {"dice": "Dice ↑", "hd95": "HD95 (px) ↓", "s_alpha": "S_α ↑"}
    fig, axes = plt.subplots(2, len(models), figsize=(4.2 * len(models), 6), squeeze=False)
    for col, model in enumerate(models):
        mc = cells[cells["model"] == model]
        clips = [c for c in report_order() if c in set(mc["clip"])]
        x = np.arange(len(clips))
        for row, metric in enumerate(("dice", second)):
            ax = axes[row, col]
            for offset, (label, pick) in zip(
                (-0.2, 0.2), (("no morph", _no_morph), ("morph", best_fixed)), strict=True
            ):
                heights, errs, names, counts = [], [[], []], [], []
                for clip in clips:
                    chosen = pick(mc[mc["clip"] == clip])
                    heights.append(np.nan if chosen is None else chosen[metric])
                    for side, err in zip(("below", "above"), errs, strict=True):
                        err.append(np.nan if chosen is None else chosen[f"{metric}_{side}"])
                    names.append("" if chosen is None or label == "no morph" else chosen["morph"])
                    counts.append(0 if chosen is None else int(chosen["n"]))
                if not np.isfinite(heights).any():
                    continue  # no run of this series: no bars, no legend entry
                bars = ax.bar(x + offset, heights, 0.4, yerr=errs, label=label, capsize=2)
                label_bars(ax, bars, names, errs[1])
                note_seeds(ax, x + offset, heights, counts)
                if metric == "dice":
                    grey_unlearned(ax, bars, LEARNED_DICE, f"Dice < {LEARNED_DICE:g}")
            ax.set_xticks(x, [clip_label(c) for c in clips], fontsize=8)
            ax.set_xlim(-0.7, len(clips) - 0.3)
            ax.set_ylabel(labels[metric])
            if row == 0:
                ax.set_title(model_label(model))
    axes[0, 0].legend(*legend_handles(fig), fontsize=8)
    fig.suptitle(
        f"{dataset}: clipping strategies with and without DP-Morph "
        f"(test set, mean;\n{INTERVAL_METHOD})"
    )
    fig.tight_layout()  # the two-line title clear of the panel titles
    save_figure(fig, png_path)


def _no_morph(cells: pd.DataFrame) -> pd.Series | None:
    hit = cells[cells["morph"] == "none"]
    return None if hit.empty else hit.iloc[0]


def best_fixed(cells: pd.DataFrame) -> pd.Series | None:
    fixed = cells[cells["morph"].map(morph_kind) == "fixed"]
    if fixed.empty:
        return None
    return fixed.sort_values(
        ["val_dice", "morph"], ascending=[False, True], na_position="last"
    ).iloc[0]


def training_time_figure(metrics_paths: Iterable[str | Path], png_path: str | Path) -> None:
    """Fig. 8: mean training seconds per (model, clip) for no / fixed / adaptive morphology."""
    runs = collect_runs(metrics_paths)
    runs = runs.assign(kind=runs["morph"].map(morph_kind))
    datasets = [d for d in SEG_DATASETS if d in set(runs["dataset"])]
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False)
    kinds = MORPH_KINDS
    for ax, dataset in zip(axes[0], datasets, strict=True):
        sub = runs[runs["dataset"] == dataset]
        means = sub.groupby(["model", "clip", "kind"])["train_seconds"].mean()
        groups = [
            (m, c)
            for m in model_order()
            for c in report_order()
            if any((m, c, k) in means.index for k in kinds)
        ]
        x = np.arange(len(groups))
        present = [k for k in kinds if k in set(sub["kind"])]
        width = 0.8 / max(1, len(present))
        for i, kind in enumerate(present):
            heights = [means.get((m, c, kind), np.nan) for m, c in groups]
            ax.bar(
                x + (i - (len(present) - 1) / 2) * width,
                heights,
                width,
                label={"none": "no morph"}.get(kind, f"{kind} morph"),
            )
        ax.set_xticks(x, [f"{model_label(m)}\n{clip_label(c)}" for m, c in groups], fontsize=7)
        ax.set_ylabel("training time (s)")
        ax.set_title(dataset)
        ax.legend(fontsize=8)
    fig.suptitle("Training time per model and clipping rule (mean over runs)")
    save_figure(fig, png_path)


def utility_runs(metrics_paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per run (panel `<dataset> · <model>`, line, eps as float, value = test Dice),
    in report order: datasets, models, non-private first, morph kind, clip rule, morph, ε. A
    line is Table 3's method, prefixed by its setting when private (`No Morph`, `DP + Morph:
    Flat (both-k3)`)."""
    runs = collect_runs(metrics_paths)
    models, clips = model_order(), report_order()
    order = runs.apply(
        lambda r: (
            SEG_DATASETS.index(r["dataset"]),
            models.index(r["model"]),
            r["clip"] != "none",
            MORPH_KINDS.index(morph_kind(r["morph"])),
            clips.index(r["clip"]),
            r["morph"],
            parse_eps(str(r["eps"])),
            int(r["seed"]),
        ),
        axis=1,
    )
    runs = runs.assign(_order=order).sort_values("_order", kind="stable")
    return pd.DataFrame(
        {
            "panel": [
                f"{dataset_label(d)} · {model_label(m)}"
                for d, m in zip(runs["dataset"], runs["model"], strict=True)
            ],
            "line": [
                method if setting == "Non-private" else f"{setting}: {method}"
                for setting, method in map(setting_method, runs["clip"], runs["morph"])
            ],
            "eps": [parse_eps(str(e)) for e in runs["eps"]],
            "value": runs["dice"].astype(float).to_numpy(),
        }
    )


def privacy_utility_report(
    metrics_paths: Iterable[str | Path], png_path: str | Path, csv_path: str | Path
) -> None:
    """Write the figure (`png_path` + .pdf) and its plotted values (`csv_path` + twins:
    panel, line, eps, n_seeds, dice_mean, dice_ci_low, dice_ci_high)."""
    data = privacy_utility.points(utility_runs(metrics_paths))
    floors = dict.fromkeys(data["panel"], LEARNED_DICE)
    rule = f"Dice < {LEARNED_DICE:g}"
    fig = privacy_utility.figure(data, "test Dice", "seg: test Dice vs ε", floors, rule)
    save_figure(fig, png_path)
    write_table(privacy_utility.named(data, "dice"), csv_path)
