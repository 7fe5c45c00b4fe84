"""Paper 002 Figs. 11 and 12: adaptive DP-Morph on duke.

Fig. 11 (from metrics.json): per model with adaptive runs, grouped bars of test Dice (mean ±
95 % t-interval over seeds) per clip rule: no morphology, the fixed variant with the best mean
*validation* Dice (its name on the bar), adaptive v1–v3 with the configured quantiles and the
paper's batch scope, and, hatched, the per-image (sound, `-s`) variants where they ran.

Fig. 12 (from the runs' diagnostics/history.csv and diagnostics/morph_log.csv, a non-private
diagnostic: the morphology log is computed from training batches without noise): adaptive v2
runs (UNet++ if it has any), one column per clip rule, lowest seed. Top: mean thickness t̄_c of
each retinal layer per epoch (pixels per image column) with the mean thresholds T_thin,
T_thick. Bottom: validation Dice of each layer after the last epoch, coloured by the operation
the policy assigned that layer most often in the last epoch.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from dpmed.config.grid import wildcards_from_path
from dpmed.data.oct import DUKE_CLASSES
from dpmed.report.intervals import INTERVAL_METHOD, error_bars
from dpmed.report.style import (
    grey_unlearned,
    integer_ticks,
    label_bars,
    legend_handles,
    note_seeds,
    save_figure,
    series_look,
)
from dpmed.seg.claims import LEARNED_DICE
from dpmed.seg.grid import clip_overrides
from dpmed.seg.morphology import (
    OPERATIONS,
    RETINAL_CLASSES,
    RETINAL_DATASET,
    adaptive_variants,
    has_quantiles,
    morph_kind,
    parse_morph,
)
from dpmed.seg.outputs import HISTORY, LAYER_VARIANT, MORPH_LOG
from dpmed.seg.report.ablation import clip_groups, plain_clip, setting_labels
from dpmed.seg.report.labels import model_label, model_order
from dpmed.seg.report.main import best_fixed, collect_runs

OPERATION_COLOR = {"open": "tab:blue", "close": "tab:orange", "both": "tab:green"}


def bars() -> list[tuple[str, str, int, bool]]:
    """Fig. 11 bar categories: (key, legend label, colour index, hatched): no morph, the best
    fixed variant, each adaptive variant with the paper's batch scope, then each per-image
    (hatched, its batch-scope colour)."""
    variants = [parse_morph(name).variant for name in adaptive_variants()]
    out = [("none", "no morph", 0, False), ("fixed", "best fixed (val Dice)", 1, False)]
    out += [(v, f"adaptive {v}", 2 + i, False) for i, v in enumerate(variants)]
    out += [(f"{v}-s", f"adaptive {v}, per-image", 2 + i, True) for i, v in enumerate(variants)]
    return out


def _category(morph: str) -> str | None:
    """Fig. 11 bar of a morph wildcard; None for quantile variants (`-qL-H`, Table 2 only)."""
    kind = morph_kind(morph)
    if kind != "adaptive":
        return kind
    if has_quantiles(morph):
        return None
    spec = parse_morph(morph)
    return spec.variant + ("-s" if spec.scope == "sample" else "")


def _bar(cell_runs: pd.DataFrame, key: str) -> tuple[float, float, float, str, int]:
    """(mean, below, above, name, seeds) of test Dice for bar `key` in one (model, clip, ε)
    group: `error_bars` (NaN where no interval is drawn), the fixed variant's name."""
    runs = cell_runs[cell_runs["category"] == key]
    if key == "fixed" and not runs.empty:
        means = runs.groupby("morph", as_index=False)["val_dice"].mean()
        runs = runs[runs["morph"] == best_fixed(means)["morph"]]
    if runs.empty:
        return np.nan, np.nan, np.nan, "", 0
    name = runs["morph"].iloc[0] if key == "fixed" else ""
    return *error_bars(runs["dice"]), name, len(runs)


def adaptive_figure(metrics_paths: Iterable[str | Path], png_path: str | Path) -> None:
    """Fig. 11: per model with adaptive runs on duke, clip rules × morphology bars."""
    runs = collect_runs(metrics_paths)
    runs = plain_clip(runs[runs["dataset"] == RETINAL_DATASET])
    runs = runs.assign(category=[_category(m) for m in runs["morph"]]).dropna(subset="category")
    adaptive = runs["morph"].map(morph_kind) == "adaptive"
    models = [m for m in model_order() if adaptive[runs["model"] == m].any()]
    if not models:
        raise ValueError("no adaptive (default-quantile) seg runs on duke for Fig. 11")
    categories = bars()
    fig, axes = plt.subplots(
        1, len(models), figsize=(5 * len(models) + 2, 4), squeeze=False, layout="constrained"
    )
    for ax, model in zip(axes[0], models, strict=True):
        sub = runs[runs["model"] == model]
        groups = clip_groups(sub)
        labels = setting_labels(groups)
        drawn_bars = [b for b in categories if b[0] in set(sub["category"])]
        width = 0.8 / len(drawn_bars)
        x = np.arange(len(groups))
        for i, (key, label, colour, hatched) in enumerate(drawn_bars):
            cells = [_bar(sub[(sub["clip"] == c) & (sub["eps"] == e)], key) for c, e in groups]
            at = x + (i - (len(drawn_bars) - 1) / 2) * width
            drawn = ax.bar(
                at,
                [c[0] for c in cells],
                width,
                yerr=[[c[1] for c in cells], [c[2] for c in cells]],
                capsize=2,
                label=label,
                color=f"C{colour}",
                hatch="//" if hatched else None,
                edgecolor="white" if hatched else None,
            )
            label_bars(ax, drawn, [c[3] for c in cells], [c[2] for c in cells])
            note_seeds(ax, at, [c[0] for c in cells], [c[4] for c in cells])
            grey_unlearned(ax, drawn, LEARNED_DICE, f"Dice < {LEARNED_DICE:g}")
        ax.set_xticks(x, [labels[g] for g in groups], fontsize=8)
        ax.set_xlim(-0.7, len(groups) - 0.3)
        ax.set_ylabel("test Dice ↑")
        ax.set_title(model_label(model))
    handles = dict(zip(*reversed(legend_handles(fig)), strict=True))
    names = [b[1] for b in categories if b[1] in handles]
    names += [n for n in handles if n not in names]  # "did not learn"
    fig.legend([handles[n] for n in names], names, fontsize=8, loc="outside right")
    fig.suptitle(
        f"{RETINAL_DATASET}: adaptive DP-Morph vs fixed vs none "
        f"(test set, mean;\n{INTERVAL_METHOD})"
    )
    save_figure(fig, png_path)


def _layer_runs(run_dirs: Iterable[str | Path]) -> tuple[str, list[tuple[dict, Path]]]:
    """Fig. 12's model and its adaptive-v2 duke runs with a morph log: lowest seed per
    (clip, ε), in the paper's clip order."""
    found = []
    for run_dir in run_dirs:
        wc = wildcards_from_path("seg", run_dir)
        plain = not clip_overrides(wc["clip"])
        if wc["dataset"] == RETINAL_DATASET and wc["morph"] == LAYER_VARIANT and plain:
            if not pd.read_csv(Path(run_dir) / MORPH_LOG).empty:
                found.append((wc, Path(run_dir)))
    models = [m for m in model_order() if any(wc["model"] == m for wc, _ in found)]
    if not models:
        raise ValueError("no duke adaptive-v2 seg runs with a morph log for Fig. 12")
    found = [(wc, d) for wc, d in found if wc["model"] == models[0]]
    chosen = {}
    for wc, run_dir in sorted(found, key=lambda r: int(r[0]["seed"])):
        chosen.setdefault((wc["clip"], wc["eps"]), (wc, run_dir))
    return models[0], [chosen[g] for g in clip_groups(pd.DataFrame([wc for wc, _ in found]))]


def layer_figure(run_dirs: Iterable[str | Path], png_path: str | Path) -> None:
    """Fig. 12: per clip rule, layer thickness per epoch (top) and last-epoch layer Dice
    coloured by the most frequent operation (bottom), for adaptive v2 on duke."""
    model, runs = _layer_runs(run_dirs)
    labels = setting_labels((wc["clip"], wc["eps"]) for wc, _ in runs)
    fig, axes = plt.subplots(
        2, len(runs), figsize=(4.2 * len(runs) + 1.5, 7), squeeze=False, layout="constrained"
    )
    layers = np.array(RETINAL_CLASSES)
    for col, (wc, run_dir) in enumerate(runs):
        log = pd.read_csv(run_dir / MORPH_LOG)
        history = pd.read_csv(run_dir / HISTORY)
        top, bottom = axes[0, col], axes[1, col]
        for c in RETINAL_CLASSES:
            rows = log[log["class"] == c]
            label = f"{c} {DUKE_CLASSES[c]}"
            top.plot(
                rows["epoch"], rows["thickness"], color=f"C{c - 1}", label=label,
                **series_look(c - 1),
            )  # fmt: skip
        thresholds = log.groupby("epoch")[["t_thin", "t_thick"]].first()
        for name, style in (("t_thin", ":"), ("t_thick", "--")):
            top.plot(thresholds.index, thresholds[name], style, color="black", label=name)
        top.set_xlabel("epoch")
        integer_ticks(top.xaxis)
        top.set_ylabel("mean thickness (px per column)")
        top.set_title(f"{labels[wc['clip'], wc['eps']]} (seed {wc['seed']})")
        last = log[log["epoch"] == log["epoch"].max()].set_index("class")["operation"]
        final = history.iloc[-1]
        dice = [final.get(f"val_dice_c{c}", np.nan) for c in RETINAL_CLASSES]
        colours = [OPERATION_COLOR[last.get(c)] for c in RETINAL_CLASSES]
        bottom.bar(layers, dice, color=colours)
        bottom.set_xticks(layers, [DUKE_CLASSES[c] for c in RETINAL_CLASSES], rotation=45)
        bottom.set_ylim(0, 1)
        bottom.set_ylabel(f"val Dice after epoch {int(final['epoch'])}")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), fontsize=7, loc="outside right upper")
    handles = [Patch(color=OPERATION_COLOR[op], label=op) for op in OPERATIONS]
    fig.legend(handles=handles, fontsize=7, title="last-epoch op.", loc="outside right lower")
    fig.suptitle(
        f"{RETINAL_DATASET}, {model_label(model)}, adaptive v2: layer thickness and layer Dice"
    )
    save_figure(fig, png_path)
