"""xcal privacy–utility figure: test F1 against the target ε for every method of the IID runs
(paper 001 §6), one panel per dataset × model, mean over seeds with the 95 % t-interval; the
non-private runs (ε = ∞) as reference lines (`dpmed.report.privacy_utility`). The plotted
values are written beside it as a table."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from dpmed.report import privacy_utility
from dpmed.report.style import save_figure, write_table
from dpmed.xcal.claims import CHANCE_FACTOR
from dpmed.xcal.report import UNLEARNED_RULE, chance, collect
from dpmed.xcal.shifts import POOLED

METRIC = "f1"


def utility_runs(metrics_paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per IID run (panel `<dataset> · <model>`, line, eps as float, value = test F1)
    in `collect`'s order (dataset, model, method, clients, ε). A line is the method, with the
    client count (`static · 3 clients`) where a panel has runs with different counts."""
    runs = collect([Path(p).parent for p in metrics_paths])
    runs = runs[runs["shift"] == POOLED]
    if runs.empty:
        raise ValueError(f"no xcal run with shift {POOLED}")
    panel = runs["dataset"] + " · " + runs["model"]
    counts = runs.groupby(panel)["clients"].transform("nunique")
    line = [
        f"{method} · {clients} client{'s' * (clients != 1)}" if n > 1 else method
        for method, clients, n in zip(runs["method"], runs["clients"], counts, strict=True)
    ]
    return pd.DataFrame(
        {
            "panel": panel.to_numpy(),
            "line": line,
            "eps": runs["eps"].astype(float).to_numpy(),
            "value": runs[METRIC].astype(float).to_numpy(),
        }
    )


def privacy_utility_report(
    metrics_paths: Iterable[str | Path], png_path: str | Path, csv_path: str | Path
) -> None:
    """Write the figure (`png_path` + .pdf) and its plotted values (`csv_path` + twins:
    panel, line, eps, n_seeds, f1_mean, f1_ci_low, f1_ci_high)."""
    data = privacy_utility.points(utility_runs(metrics_paths))
    chances = {panel: chance(panel.split(" · ")[0]) for panel in data["panel"]}
    floors = {panel: CHANCE_FACTOR * level for panel, level in chances.items()}
    fig = privacy_utility.figure(
        data, "test F1", "xcal: test F1 vs ε (IID)", floors, UNLEARNED_RULE, chances
    )
    save_figure(fig, png_path)
    write_table(privacy_utility.named(data, METRIC), csv_path)
