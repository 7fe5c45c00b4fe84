"""Paper 002 Fig. 7: distributions of the per-step gradient cosine per clip rule, one panel per
(dataset, model), from the runs' diagnostics/alignment.csv: a non-private diagnostic (the
cosine of the un-noised clipped gradient sum).

Paper layout: top row UNet++ on Duke, UMN, COVID-19; bottom row UNet on Duke and UMN, Inf-Net
on COVID-19. Only the panels with runs are drawn (paper panels first, in that order, then any
other model), three per row. Each panel pools every step of the private paper cells of its
(dataset, model) — all seeds, morphologies and ε (the ε values are in the title); lr × C sweep
cells and morphology ablations are left out. Box plots with every step as a jittered point
(fixed seed), NaN cosines (a zero gradient) dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.config.wildcards import format_eps, parse_eps
from dpmed.data.registry import dataset_label
from dpmed.privacy.clipping import CLIP_RULES, report_order
from dpmed.report.style import save_figure
from dpmed.seg.grid import SEG_DATASETS, is_paper_cell
from dpmed.seg.report.labels import clip_label, model_label, model_order

# Bottom row of the paper's Fig. 7: the model shown per dataset.
BOTTOM_MODEL = {"duke": "unet", "umn": "unet", "covidct": "infnet"}


def collect_alignment(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Every step of the private paper cells: wildcards + alignment.csv columns.

    Raises ValueError when no such run has a step with a finite cosine.
    """
    frames = []
    for path in paths:
        wc = wildcards_from_path("seg", path)
        if not is_paper_cell(wc) or not CLIP_RULES[wc["clip"]].bounded:
            continue
        steps = pd.read_csv(path)
        frames.append(steps.assign(**wc))
    steps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not steps.empty:
        steps = steps[np.isfinite(steps["cosine"].astype(float))]
    if steps.empty:
        raise ValueError("no alignment steps of private seg paper cells given")
    return steps.sort_values(["dataset", "model", "clip", "morph", "eps", "seed", "step"])


def _panel_rank(dataset: str, model: str) -> tuple[int, int, int]:
    row = 0 if model == "unetpp" else (1 if BOTTOM_MODEL.get(dataset) == model else 2)
    return row, SEG_DATASETS.index(dataset), model_order().index(model)


def alignment_figure(alignment_paths: Iterable[str | Path], png_path: str | Path) -> pd.DataFrame:
    """Draw Fig. 7 from alignment.csv files to `png_path` (+ .pdf); print and return the
    median cosine per panel and rule (columns dataset, model, clip, steps, median)."""
    steps = collect_alignment(alignment_paths)
    panels = sorted(
        {(d, m) for d, m in zip(steps["dataset"], steps["model"], strict=True)},
        key=lambda panel: _panel_rank(*panel),
    )
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False, sharey=True
    )
    rng = np.random.default_rng(0)
    clip_rank = report_order()
    private = [c for c in clip_rank if CLIP_RULES[c].bounded]
    medians = []
    for index, (ax, (dataset, model)) in enumerate(zip(axes.flat, panels, strict=False)):
        cell = steps[(steps["dataset"] == dataset) & (steps["model"] == model)]
        clips = [c for c in private if c in set(cell["clip"])]
        values = [cell.loc[cell["clip"] == c, "cosine"].to_numpy(float) for c in clips]
        positions = np.arange(len(clips))
        ax.boxplot(
            values, positions=positions, widths=0.6, showfliers=False, medianprops={"color": "k"}
        )
        for x, v in zip(positions, values, strict=True):
            jitter = rng.uniform(-0.18, 0.18, size=len(v))
            ax.scatter(x + jitter, v, s=5, alpha=0.4, color=f"C{clip_rank.index(clips[x])}")
        ax.set_xticks(positions, [clip_label(c) for c in clips], fontsize=8)
        ax.axhline(1.0, color="0.7", lw=0.6, ls="--")
        eps = ", ".join(format_eps(e) for e in sorted({parse_eps(e) for e in cell["eps"]}))
        label = f"{dataset_label(dataset)}, {model_label(model)} (ε = {eps})"
        ax.set_title(f"({chr(ord('a') + index)}) {label}", fontsize=9)
        if index % ncols == 0:
            ax.set_ylabel("cosine(transformed, true gradient)")
        for clip, v in zip(clips, values, strict=True):
            row = {"dataset": dataset, "model": model, "clip": clip, "steps": len(v)}
            medians.append(row | {"median": float(np.median(v))})
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle("Gradient cosine similarity under DP training (per optimizer step)")
    fig.tight_layout()
    save_figure(fig, png_path)
    summary = pd.DataFrame(medians)
    for (dataset, model), rows in summary.groupby(["dataset", "model"], sort=False):
        text = ", ".join(
            f"{clip_label(r.clip)} {r.median:.4f} (n={r.steps})" for r in rows.itertuples()
        )
        print(f"Fig. 7 {dataset}/{model} median cosine: {text}", flush=True)
    return summary
