"""Paper 002 ablations from the runs' metrics.json files: Fig. 2 (flat clipping, learning rate ×
clipping threshold C) and Table 2 (adaptive DP-Morph quantile thresholds).

Fig. 2 cells are the runs whose clip wildcard carries a sweep suffix (`flat-C0.5-lr0.001`);
each cell is the mean test Dice over its seeds (the paper averages four runs per setting, we
average the configured seeds). Runs without the suffix are not in the figure: metrics.json does
not record their lr and C.

Table 2: Δ_{a,b} = Dice_{base} − Dice_{a,b} with Dice the *validation* Dice, averaged over the
seeds both sides ran (the paper: "mean over top-3 runs"; we use every configured seed), with
the 95 % t-interval of the per-seed differences and their paired t-test; base = the study's
configured quantiles (paper: (20, 85)); positive Δ means the base thresholds are better. Only
the paper's batch scope (no `-s`) and plain clip names; a run `adaptive-vN` without a `-qL-H`
suffix used the configured quantiles.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dpmed.config.wildcards import format_eps, parse_eps
from dpmed.privacy.clipping import paper_column_order, report_order
from dpmed.report.intervals import paired_p, summarize, t_interval
from dpmed.report.style import grey_unlearned_cells, save_figure, write_table
from dpmed.seg.claims import LEARNED_DICE
from dpmed.seg.grid import SEG_DATASETS, clip_overrides, clip_rule
from dpmed.seg.morphology import RETINAL_DATASET, morph_kind, parse_morph
from dpmed.seg.report.labels import clip_label, model_label, model_order
from dpmed.seg.report.main import collect_runs


def setting_labels(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Label of each (clip rule, ε) pair: the rule's name, plus ε where the rule ran at several."""
    pairs = sorted(set(pairs))
    per_rule = Counter(clip for clip, _ in pairs)
    return {(c, e): clip_label(c) + (f" (ε={e})" if per_rule[c] > 1 else "") for c, e in pairs}


def clip_groups(runs: pd.DataFrame, order: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(clip, ε) pairs present in `runs`, in `order` of the rules (default: the report
    order), then ascending ε."""
    order = report_order() if order is None else order
    pairs = set(zip(runs["clip"], runs["eps"], strict=True))
    return sorted(pairs, key=lambda p: (order.index(p[0]), parse_eps(p[1])))


def plain_clip(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of the main grid: clip wildcards without a hyperparameter sweep suffix."""
    return runs[[not clip_overrides(c) for c in runs["clip"]]]


def sweep_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """Fig. 2 cells: seed count and test Dice mean with its 95 % t-interval over seeds
    (`dpmed.report.intervals.summarize`) per (dataset, model, rule, ε, lr, C) over the runs
    whose clip carries a sweep suffix."""
    overrides = [clip_overrides(c) for c in runs["clip"]]
    keep = [bool(o) for o in overrides]
    swept = runs[keep].assign(
        rule=[clip_rule(c) for c in runs["clip"][keep]],
        lr=[o["lr"] for o in overrides if o],
        C=[o["clip_norm"] for o in overrides if o],
    )
    if swept.empty:
        raise ValueError("no seg runs with a clip sweep suffix (e.g. flat-C0.5-lr0.001)")
    keys = ["dataset", "model", "rule", "eps", "lr", "C"]
    cells = summarize(swept, keys, ["dice"])
    models, clips = model_order(), report_order()
    order = [
        (SEG_DATASETS.index(d), models.index(m), clips.index(r), parse_eps(e), lr, c)
        for d, m, r, e, lr, c in cells[keys].itertuples(index=False)
    ]
    return cells.iloc[sorted(range(len(cells)), key=order.__getitem__)].reset_index(drop=True)


def lr_clip_figure(metrics_paths: Iterable[str | Path], png_path: str | Path) -> pd.DataFrame:
    """Fig. 2: one heatmap per (dataset, model, rule, ε) with sweep runs — rows learning rate,
    columns C (both ascending), cell = mean test Dice (n annotated where a cell has fewer
    seeds than the panel's fullest). Returns the cell table."""
    cells = sweep_cells(collect_runs(metrics_paths))
    panels = list(cells.groupby(["dataset", "model", "rule", "eps"], sort=False))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False, layout="constrained"
    )
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.85")
    for ax, ((dataset, model, rule, eps), panel) in zip(axes[0], panels, strict=True):
        mean = panel.pivot(index="lr", columns="C", values="dice_mean").sort_index(axis=0)
        mean = mean.sort_index(axis=1)
        seeds = panel.pivot(index="lr", columns="C", values="n_seeds").reindex_like(mean)
        image = ax.imshow(np.ma.masked_invalid(mean.to_numpy(float)), cmap=cmap, aspect="auto")
        full = int(panel["n_seeds"].max())
        for (i, j), value in np.ndenumerate(mean.to_numpy(float)):
            if np.isfinite(value):
                n = int(seeds.iloc[i, j])
                text = f"{value:.3f}" + (f"\nn={n}" if n < full else "")
                shade = "black" if image.norm(value) > 0.6 else "white"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=shade)
        ax.set_xticks(range(mean.shape[1]), [format_eps(c) for c in mean.columns])
        ax.set_yticks(range(mean.shape[0]), [format_eps(lr) for lr in mean.index])
        ax.set_xlabel("clipping threshold C")
        ax.set_ylabel("learning rate")
        ax.set_title(f"{dataset} · {model_label(model)} · {clip_label(rule)} · ε={eps}")
        grey_unlearned_cells(ax, mean.to_numpy(float), LEARNED_DICE, f"Dice < {LEARNED_DICE:g}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
        fig.colorbar(image, ax=ax, label="test Dice")
    fig.suptitle("Clipping ablation: test Dice over learning rate × C (mean over seeds)")
    save_figure(fig, png_path)
    return cells


def lr_clip_report(
    metrics_paths: Iterable[str | Path], png_path: str | Path, csv_path: str | Path
) -> None:
    """Fig. 2 (png + pdf) and its cell table (csv + md)."""
    write_table(lr_clip_figure(metrics_paths, png_path), csv_path)


def quantile_table(
    metrics_paths: Iterable[str | Path], quantiles: Sequence[float] = (20, 85)
) -> pd.DataFrame:
    """Table 2 on duke: rows model × policy vN × Δ_{a,b} for every `-qa-b` variant present;
    per clip rule (label L, ε appended if a rule ran at several) the columns L = mean over
    paired seeds of val Dice(configured `quantiles`) − val Dice(a, b), `L_ci_low`, `L_ci_high`
    (95 % t-interval of those differences) and `L_p_vs_base` (`paired_p`); NaN where the two
    sides share no seed."""
    base = (float(quantiles[0]), float(quantiles[1]))
    runs = plain_clip(collect_runs(metrics_paths))
    runs = runs[runs["dataset"] == RETINAL_DATASET]
    runs = runs[runs["morph"].map(morph_kind) == "adaptive"]
    specs = [parse_morph(m, base) for m in runs["morph"]]
    runs = runs.assign(
        version=[s.variant for s in specs],
        q_low=[s.quantiles[0] for s in specs],
        q_high=[s.quantiles[1] for s in specs],
        scope=[s.scope for s in specs],
    )
    runs = runs[runs["scope"] == "batch"]
    varied = (runs["q_low"] != base[0]) | (runs["q_high"] != base[1])
    models = [m for m in model_order() if varied[runs["model"] == m].any()]
    if not models:
        raise ValueError("no batch-scope adaptive-vN-qL-H runs on duke for the quantile table")
    runs = runs[runs["model"].isin(models)]
    score = runs.set_index(["model", "version", "q_low", "q_high", "clip", "eps", "seed"])
    score = score["val_dice"].sort_index()
    columns = clip_groups(runs, paper_column_order(baseline_first=False))
    labels = setting_labels(columns)
    rows = []
    for model in models:
        sub = runs[runs["model"] == model]
        variants = sorted(set(zip(sub["q_low"], sub["q_high"], strict=True)) - {base})
        for version, q in itertools.product(sorted(set(sub["version"])), variants):
            setting = f"Δ_{{{q[0]:g},{q[1]:g}}}"
            row = {"model": model_label(model), "policy": version, "setting": setting}
            for clip, eps in columns:
                row |= _paired_delta(
                    _seeds(score, (model, version, *base, clip, eps)),
                    _seeds(score, (model, version, *q, clip, eps)),
                    labels[clip, eps],
                )
            rows.append(row)
    return pd.DataFrame(rows)


def _seeds(score: pd.Series, cell: tuple) -> pd.Series:
    """Val Dice by seed of one cell (empty if it did not run)."""
    return score[cell] if cell in score.index.droplevel("seed") else pd.Series(dtype=float)


def _paired_delta(base: pd.Series, other: pd.Series, label: str) -> dict[str, float]:
    """Table 2 columns of one cell: mean base − other over the shared seeds, its t-interval
    and the paired t-test."""
    seeds = sorted(set(base.index) & set(other.index))
    if not seeds:
        return {label: np.nan, f"{label}_ci_low": np.nan, f"{label}_ci_high": np.nan,
                f"{label}_p_vs_base": np.nan}  # fmt: skip
    mean, low, high = t_interval((base[seeds] - other[seeds]).to_numpy(float))
    return {
        label: mean,
        f"{label}_ci_low": low,
        f"{label}_ci_high": high,
        f"{label}_p_vs_base": paired_p(base[seeds].to_numpy(float), other[seeds].to_numpy(float)),
    }


def write_quantile_table(
    metrics_paths: Iterable[str | Path], quantiles: Sequence[float], csv_path: str | Path
) -> None:
    """Table 2 as csv (+ md)."""
    write_table(quantile_table(metrics_paths, quantiles), csv_path)
