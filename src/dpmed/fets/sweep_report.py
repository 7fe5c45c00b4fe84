"""The fets ε0 × collaborators-per-round sweep: final validation Dice against the per-round
budget ε0 for every aggregator and DP mode, one panel per m (collaborators per round), and its
companion table with the noise σ per coordinate of every (mode, m, ε0).

The runs are those of the grid blocks with a `sweep` over the participation ρ
(`dpmed.fets.grid.sweep`; their aggregator wildcard is `<aggregator>-rho<ρ>`). m is read from
each run's selection.csv (the collaborators of every round), σ from its rounds.csv (`sigma`:
the round's largest per-coordinate noise std over its mechanisms, `sigma_min` the smallest).
A DP run's `gain_fraction` is the share of its non-private baseline's gain over the untrained
model it keeps, (Dice − Dice₀)/(Dice_none − Dice₀), Dice₀ the round-0 (untrained) Dice of the
same runs and Dice_none that of the baseline (the aggregator without `dp_`: SimAgg for both
DP-SimAgg modes, FedAvg for DP-FedAvg) at the same m: near 1 where collaborator-level DP is
usable, near 0 where the noise leaves the model untrained.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.config.wildcards import format_eps, parse_eps
from dpmed.fets.aggregation import AGGREGATORS, DP_MODES, aggregator_mode
from dpmed.fets.claims import LEARNED_DICE
from dpmed.fets.grid import aggregator_name, participation_override
from dpmed.report.intervals import INTERVAL_METHOD, STATS, shown_interval, summarize
from dpmed.report.style import (
    grey_unlearned_points,
    note_seeds,
    plain_log_ticks,
    save_figure,
    write_table,
)

METRIC, METRIC_LABEL = "dice_WT", "final Dice WT"
METRICS = ("dice_WT", "dice_mean_labels")  # final-round validation Dice in the table
CELL = ["method", "aggregator", "dpmode", "rho", "m", "eps"]


def per_round(selection_csv: str | Path) -> int:
    """m, the collaborators chosen in every round of a run's selection log (raises when the
    rounds differ)."""
    counts = pd.read_csv(selection_csv).groupby("round").size().unique()
    if len(counts) != 1:
        raise ValueError(f"{selection_csv}: rounds choose {sorted(counts)} collaborators")
    return int(counts[0])


def run_row(run_dir: str | Path) -> dict:
    """One sweep run: its cell (method, aggregator, dpmode, ρ, m, ε0), seed, final and
    round-0 Dice, σ range over its rounds and mechanisms, Δf, clip norm and model size."""
    run = Path(run_dir)
    wc = wildcards_from_path("fets", run)
    name, rho = aggregator_name(wc["aggregator"]), participation_override(wc["aggregator"])
    if not rho:
        raise ValueError(f"{run} is not a participation-sweep run (<aggregator>-rho<rho>)")
    metrics = json.loads((run / "metrics.json").read_text())
    rounds = pd.read_csv(run / "rounds.csv")
    rounds = rounds[rounds["round"] > 0]
    return {
        "method": aggregator_mode(name, wc["dpmode"]).label,
        "aggregator": name,
        "dpmode": wc["dpmode"],
        "rho": rho["participation"],
        "m": per_round(run / "selection.csv"),
        "eps": parse_eps(wc["eps"]),
        "seed": int(wc["seed"]),
        **{k: float(metrics[k]) for k in METRICS},
        "dice_WT_round0": float(metrics["dice_WT_round0"]),
        "sigma_min": float(rounds["sigma_min"].min()),
        "sigma_max": float(rounds["sigma"].max()),
        "delta_f_max": float(rounds["delta_f"].max()),
        "rounds": int(metrics["rounds"]),
        "n_parameters": int(metrics["n_parameters"]),
    }


def runs_frame(run_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """One row per run (`run_row`), ordered by m, registered method order, ε0, seed."""
    frame = pd.DataFrame([run_row(run) for run in run_dirs])
    order = [aggregator_mode(a, d).order for a, d in zip(frame["aggregator"], frame["dpmode"],
                                                           strict=True)]  # fmt: skip
    frame.insert(0, "_order", order)
    frame = frame.sort_values(["m", "_order", "eps", "seed"], kind="stable")
    return frame.drop(columns="_order").reset_index(drop=True)


def baseline(aggregator: str) -> str | None:
    """The non-private aggregator a DP aggregator adds noise to (`dp_simagg` → `simagg`), or
    None when there is none registered."""
    name = aggregator.removeprefix("dp_")
    return name if name != aggregator and name in AGGREGATORS else None


def sweep_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (method, aggregator, dpmode, ρ, m, ε0): n_seeds, mean and 95 %
    t-interval of the final Dice WT and mean-over-labels Dice, σ per coordinate (min and max
    over rounds, mechanisms and seeds), the largest Δf, and `gain_fraction` (module docstring)
    of the mean Dice WT; non-private cells have σ, Δf and gain NaN."""
    table = summarize(runs, CELL, [*METRICS, "dice_WT_round0"])
    noise = runs.groupby(CELL, sort=False).agg(
        sigma_min=("sigma_min", "min"), sigma_max=("sigma_max", "max"),
        delta_f_max=("delta_f_max", "max"),
    ).reset_index()  # fmt: skip
    table = table.merge(noise, on=CELL, how="left")
    plain = table[[not DP_MODES[d].private for d in table["dpmode"]]]
    reference = {(a, m): v for a, m, v in zip(plain["aggregator"], plain["m"],
                                              plain[f"{METRIC}_mean"], strict=True)}  # fmt: skip
    base = np.array([reference.get((baseline(a), m), np.nan)
                     for a, m in zip(table["aggregator"], table["m"], strict=True)])  # fmt: skip
    floor = table[f"{METRIC}_round0_mean"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        table["gain_fraction"] = (table[f"{METRIC}_mean"].to_numpy(dtype=float) - floor) / (
            base - floor
        )
    table["eps"] = [format_eps(e) for e in table["eps"]]
    round0 = [f"{METRIC}_round0_{s}" for s in STATS if s != "mean"]
    return table.drop(columns=round0)


def eps_sweep(run_dirs: Sequence[str | Path], png_path: str | Path, csv_path: str | Path) -> None:
    """The sweep figure (one panel per m: each DP mode's final Dice WT against ε0 on a log axis,
    mean over seeds with its interval (`shown_interval`); the non-private baselines as
    horizontal lines with their bands; the untrained model's Dice dotted) and its table
    (`sweep_table`)."""
    runs = runs_frame(run_dirs)
    table = sweep_table(runs)
    write_table(table, csv_path)
    ms = sorted(runs["m"].unique())
    methods = list(dict.fromkeys(runs["method"]))
    colours = {label: plt.get_cmap("tab10")(i % 10) for i, label in enumerate(methods)}
    fig, axes = plt.subplots(1, len(ms), figsize=(4.2 * len(ms), 3.8), sharey=True,
                             squeeze=False)  # fmt: skip
    finite = runs.loc[np.isfinite(runs["eps"]), "eps"]
    span = (finite.min() / 2, finite.max() * 2) if len(finite) else (0.5, 2.0)
    for ax, m in zip(axes[0], ms, strict=True):
        panel = runs[runs["m"] == m]
        for label, group in panel.groupby("method", sort=False):
            colour = colours[label]
            if not DP_MODES[group["dpmode"].iloc[0]].private:
                mean, low, high = shown_interval(group[METRIC])
                ax.axhline(mean, color=colour, linestyle="--", label=f"{label} (no DP)")
                if math.isfinite(low):
                    ax.axhspan(low, high, color=colour, alpha=0.12, linewidth=0)
                continue
            cells = list(group.groupby("eps", sort=True)[METRIC])
            eps = np.array([e for e, _ in cells])
            bands = np.array([shown_interval(values) for _, values in cells])
            ax.plot(eps, bands[:, 0], marker="o", markersize=4, color=colour, label=label)
            note_seeds(ax, eps, bands[:, 0], [len(values) for _, values in cells])
            grey_unlearned_points(ax, eps, bands[:, 0], LEARNED_DICE, f"Dice < {LEARNED_DICE:g}")
            if np.isfinite(bands[:, 1]).any():
                ax.fill_between(eps, bands[:, 1], bands[:, 2], color=colour, alpha=0.2,
                                linewidth=0)  # fmt: skip
        ax.axhline(panel[f"{METRIC}_round0"].mean(), color="grey", linestyle=":",
                   label="untrained (round 0)")  # fmt: skip
        rho = ", ".join(f"{r:g}" for r in sorted(panel["rho"].unique()))
        ax.set_title(f"m = {m} collaborators per round (rho = {rho})", fontsize=9)
        ax.set_xscale("log")
        ax.set_xlim(*span)
        plain_log_ticks(ax.xaxis)
        ax.set_xlabel("per-round budget eps0")
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel(METRIC_LABEL)
    legend = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", fontsize=8,
               ncol=min(len(legend), 4), frameon=False, bbox_to_anchor=(0.5, -0.12))  # fmt: skip
    # two lines: one line of this length is wider than a two-panel figure and was cut
    fig.suptitle(f"fets: {METRIC_LABEL} against eps0 after {runs['rounds'].max()} rounds, "
                 f"{runs['n_parameters'].max():,} parameters\nmean over seeds;\n{INTERVAL_METHOD}",
                 fontsize=10, y=1.0, va="bottom")  # fmt: skip
    save_figure(fig, png_path)
