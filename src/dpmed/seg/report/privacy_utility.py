"""seg privacy–utility figure: test Dice against the target ε for every method of the main
grid (paper 002's Table 3 cells), one panel per dataset × model, mean over seeds with the 95 %
t-interval; the non-private methods (ε = ∞) as reference lines (`dpmed.report.privacy_utility`).
The plotted values are written beside it as a table."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from dpmed.config.wildcards import parse_eps
from dpmed.report import privacy_utility
from dpmed.report.style import save_figure, write_table
from dpmed.seg.claims import LEARNED_DICE
from dpmed.seg.grid import SEG_DATASETS
from dpmed.seg.morphology import MORPH_KINDS, morph_kind
from dpmed.seg.report.labels import clip_order, dataset_label, model_label, model_order
from dpmed.seg.report.main import collect_runs, setting_method

METRIC = "dice"


def line_label(clip: str, morph: str) -> str:
    """A method's legend entry: Table 3's method, prefixed by its setting when private
    (`No Morph`, `DP + Morph: Flat (both-k3)`)."""
    setting, method = setting_method(clip, morph)
    return method if setting == "Non-private" else f"{setting}: {method}"


def utility_runs(metrics_paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per run (panel `<dataset> · <model>`, line, eps as float, value = test Dice),
    in report order: datasets, models, non-private first, morph kind, clip rule, morph, ε."""
    runs = collect_runs(metrics_paths)
    models, clips = model_order(), clip_order()
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
            "line": [line_label(c, m) for c, m in zip(runs["clip"], runs["morph"], strict=True)],
            "eps": [parse_eps(str(e)) for e in runs["eps"]],
            "value": runs[METRIC].astype(float).to_numpy(),
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
    write_table(privacy_utility.named(data, METRIC), csv_path)
