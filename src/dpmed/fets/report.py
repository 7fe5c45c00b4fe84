"""fets study outputs: Table II (+ the sound mode and baselines), the privacy table, Fig. 1
(patients per institution), Fig. 2 (the four MRI modalities with the tumour labels), Fig. 3
(selection strategies), Fig. 4 (Dice and convergence score per round) and the ε0 ×
collaborators-per-round sweep (figure and table).

Tables are split by determinism: `fets_table2.csv` holds what the same config reproduces
byte for byte (Dice, projected convergence score, simulated time, ε), `fets_resources.csv` the
measured Table II columns (wall-clock, memory, energy with its method), which vary by machine.
Method labels and the order of runs come from the aggregator registry
(`dpmed.fets.aggregation.aggregators`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from dpmed.config.grid import wildcards_from_path
from dpmed.config.wildcards import format_eps, parse_eps
from dpmed.data.fets import MODALITIES, patients_per_institution, tumour_slice
from dpmed.fets import selection
from dpmed.fets.aggregation import DP_MODES, aggregator_mode, aggregators
from dpmed.fets.brats import DICE_KEYS
from dpmed.fets.claims import LEARNED_DICE
from dpmed.fets.grid import aggregator_name, participation_override
from dpmed.fets.privacy import COLUMNS as PRIVACY_COLUMNS
from dpmed.report.intervals import (
    INTERVAL_METHOD,
    MIN_SEEDS,
    STATS,
    UNIT,
    paired_tests,
    shown_interval,
    summarize,
)
from dpmed.report.style import (
    grey_unlearned_points,
    integer_ticks,
    legend_handles,
    note_seeds,
    plain_log_ticks,
    save_figure,
    write_table,
)


def method_label(key: dict[str, str]) -> str:
    """The registered label, with ε0 for private runs: 'DP-SimAgg paper eps0=1', 'SimAgg'."""
    label = aggregator_mode(key["aggregator"], key["dpmode"]).label
    if not DP_MODES[key["dpmode"]].private:
        return label
    return f"{label} eps0={key['eps']}"


def _sorted_runs(run_dirs: Sequence[str | Path]) -> list[Path]:
    """Runs by the registered order of (aggregator, dpmode), then ε0, then seed."""

    def order(path: Path) -> tuple:
        k = wildcards_from_path("fets", path)
        rank = aggregator_mode(k["aggregator"], k["dpmode"]).order
        return (rank, parse_eps(k["eps"]), int(k["seed"]))

    return sorted((Path(p) for p in run_dirs), key=order)


def _run_rows(run_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """Final-round scores, ε and guarantee of every run, one row per run (seed an int)."""
    rows = []
    for run in _sorted_runs(run_dirs):
        key = wildcards_from_path("fets", run)
        m = json.loads((run / "metrics.json").read_text())
        p = json.loads((run / "privacy.json").read_text())
        by = p.get("epsilon_by_accountant", {})
        rows.append({
            "method": method_label(key), **key, "seed": int(key["seed"]),
            "rule": key["aggregator"].removeprefix(PRIVATE_PREFIX),
            "sim_time_min": m["sim_time_s"] / 60.0,
            "convergence_score": m["convergence_score"],
            **{k: m[k] for k in DICE_KEYS},
            **{k: v for k, v in m.items() if k.startswith("hd95_")},  # runs with hd95 on
            "dice_WT_round0": m["dice_WT_round0"],
            "eps_total_basic": by.get("basic", by.get("basic_per_tensor", np.nan)),
            "eps_total_rdp": by.get("rdp", by.get("rdp_per_tensor", np.nan)),
            "delta_total": np.nan if p["delta"] is None else p["delta"],
            "guarantee": p["guarantee"],
        })  # fmt: skip
    return pd.DataFrame(rows)


# A private aggregator is registered as dp_<rule> beside its non-private rule (dp_simagg,
# simagg), so the rule column pairs SimAgg with FedAvg in every DP mode.
PRIVATE_PREFIX = "dp_"
PRIVACY = ["eps_total_basic", "eps_total_rdp", "delta_total"]
TESTED = ["convergence_score", "dice_ET", "dice_TC", "dice_WT"]  # the paired-tested metrics


def table2(run_dirs: Sequence[str | Path], csv_path: str | Path) -> pd.DataFrame:
    """Table II (plus the sound mode and baselines): one row per method and ε0 with the
    final-round scores as mean and 95 % t-interval over seeds
    (`dpmed.report.intervals.summarize`), the largest ε and δ of its seeds, its guarantee, and
    paired t-tests over seeds of `TESTED`: SimAgg against FedAvg in the same DP mode and ε0
    (`<m>_p_vs_fedavg`), the sound mode against the paper's (`<m>_p_vs_paper`)."""
    runs = _run_rows(run_dirs)
    keys = ["method", "aggregator", "dpmode", "eps"]
    scores = [c for c in runs.columns if c not in {*keys, "seed", "rule", *PRIVACY, "guarantee"}]
    table = summarize(runs, keys, scores)
    privacy = runs.groupby(keys, sort=False).agg(
        **{c: (c, "max") for c in PRIVACY},
        guarantee=("guarantee", lambda values: ", ".join(sorted(set(values)))),
    )
    table = table.join(privacy, on=keys)
    for cell, arm, baseline in (
        (["dpmode", "eps"], "rule", "fedavg"),
        (["aggregator", "eps"], "dpmode", "paper"),
    ):
        tests = paired_tests(runs, cell, arm, baseline, TESTED)
        rows = runs[list(dict.fromkeys([*keys, arm]))].drop_duplicates()  # arm → table row
        tests = tests.merge(rows, on=[*cell, arm]).drop(columns=[] if arm in keys else arm)
        table = table.merge(tests, on=keys, how="left", validate="one_to_one")
    write_table(table, csv_path)
    return table


def resources_table(run_dirs: Sequence[str | Path], csv_path: str | Path) -> pd.DataFrame:
    """Measured resources of every run (Table II's wall-clock, memory, energy rows)."""
    rows = []
    for run in _sorted_runs(run_dirs):
        r = json.loads((run / "resources.json").read_text())
        gpu, key = r["peak_gpu_mem_mb"], wildcards_from_path("fets", run)
        rows.append({
            "method": method_label(key), **key,
            "wall_clock": r["wall_clock_hms"], "wall_clock_s": r["wall_clock_s"],
            "peak_rss_gb": r["peak_rss_mb"] / 1024.0,
            "peak_gpu_mem_gb": np.nan if gpu is None else gpu / 1024.0,
            "energy_wh": r["energy_wh"], "energy_method": r["energy_method"],
            "sim_time_min": r["simulated_time_min"], "attempts": r["attempts"],
            "device": r["device"],
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    write_table(frame, csv_path)
    return frame


def privacy_table(run_dirs: Sequence[str | Path], csv_path: str | Path) -> pd.DataFrame:
    """Per round of every DP run: mechanisms, Δf, σ, σ/Δf, ε per round, cumulative ε by basic
    and RDP composition (per monitored tensor, and over all tensor mechanisms)."""
    frames = []
    for run in _sorted_runs(run_dirs):
        key = wildcards_from_path("fets", run)
        if not DP_MODES[key["dpmode"]].private:
            continue
        guarantee = json.loads((run / "privacy.json").read_text())["guarantee"]
        rounds = pd.read_csv(run / "rounds.csv")
        rounds = rounds[rounds["round"] > 0]
        part = rounds[["round", *PRIVACY_COLUMNS]].copy()
        for column, value in reversed([("method", method_label(key)), *key.items()]):
            part.insert(0, column, value)
        part["guarantee"] = guarantee
        frames.append(part)
    columns = ["method", "aggregator", "dpmode", "eps", "seed", "round", *PRIVACY_COLUMNS,
               "guarantee"]  # fmt: skip
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    write_table(frame, csv_path)
    return frame


def figure1(processed_dir: str | Path, png_path: str | Path) -> None:
    """Fig. 1 to `png_path` (+ .pdf): patients per institution of the partitioning in the
    processed FeTS folder's splits.csv, train and val stacked."""
    table = patients_per_institution(Path(processed_dir))
    fig, ax = plt.subplots(figsize=(9, 3.2))
    x = np.arange(len(table))
    ax.bar(x, table["n_train"], color="#377eb8", label="train")
    ax.bar(x, table["n_val"], bottom=table["n_train"], color="#ff7f00", label="val")
    ax.set_xticks(x, [str(p) for p in table["partition_id"]], fontsize=7)
    ax.set_xlabel("institution (partition id)")
    ax.set_ylabel("patients")
    ax.set_title(
        f"FeTS partitioning: {int(table['n_total'].sum())} patients in "
        f"{len(table)} institutions (paper 000, Fig. 1)",
        fontsize=9,
    )
    ax.legend(frameon=False)
    save_figure(fig, png_path)


# Fig. 2's modality names and label colours (the paper's: NCR green, ED yellow, ET blue).
MODALITY_NAMES = {"t1": "T1", "t1ce": "T1ce (T1Gd)", "t2": "T2", "flair": "FLAIR"}
LABEL_STYLE = {1: ("NCR (label 1)", "#4daf4a"), 2: ("ED (label 2)", "#ffff33"),
               4: ("ET (label 4)", "#377eb8")}  # fmt: skip


def figure2(processed_dir: str | Path, png_path: str | Path) -> None:
    """Fig. 2: one axial slice of one validation subject (`dpmed.data.fets.tumour_slice`) in
    the four modalities, plain (top row) and with the BraTS labels overlaid (bottom row), from
    the processed FeTS folder to `png_path` (+ .pdf)."""
    view = tumour_slice(Path(processed_dir))
    index = np.zeros(view.label.shape, dtype=int)
    for i, value in enumerate(LABEL_STYLE, start=1):
        index[view.label == value] = i
    cmap = ListedColormap(["#00000000"] + [colour for _, colour in LABEL_STYLE.values()])
    fig, axes = plt.subplots(2, len(MODALITIES), figsize=(2.6 * len(MODALITIES), 5.6))
    for column, (name, image) in enumerate(zip(MODALITIES, view.images, strict=True)):
        top, bottom = axes[0, column], axes[1, column]
        for ax in (top, bottom):
            ax.imshow(image, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        bottom.imshow(index, cmap=cmap, vmin=0, vmax=len(LABEL_STYLE), alpha=0.6,
                      interpolation="nearest")  # fmt: skip
        top.set_title(f"({'ABCD'[column]}) {MODALITY_NAMES[name]}", fontsize=10)
    fig.legend(handles=[Patch(color=c, label=label) for label, c in LABEL_STYLE.values()],
               loc="lower center", ncol=len(LABEL_STYLE), frameon=False, fontsize=9)  # fmt: skip
    fig.suptitle(f"FeTS 2022 {view.subject}, axial slice z={view.z}: the four modalities (top) "
                 "and the tumour labels (bottom)", fontsize=10)  # fmt: skip
    save_figure(fig, png_path)


def figure3_from_run(
    selection_csv: str | Path,
    splits_csv: str | Path,
    params: dict,
    seed: int,
    png_path: str | Path,
) -> None:
    """Fig. 3: chosen collaborators per round for static, randomized and sliding window, over
    max(rounds, 3 cycles) rounds so the fresh permutation of each cycle shows. All three are
    scheduled by `dpmed.fets.selection` with the run's K (from splits.csv), ρ and seed; the
    run's own selection log `selection_csv` must equal the first `rounds` rounds of its
    strategy (checked)."""
    ids = sorted(int(i) for i in pd.read_csv(splits_csv)["partition_id"].unique())
    strategy, participation = params["selection"], float(params["participation"])
    rounds = int(params["rounds"])
    row_of = {c: i for i, c in enumerate(ids)}
    n_collaborators = len(ids)
    shown = max(rounds, 3 * -(-n_collaborators // selection.per_round(n_collaborators,
                                                                       participation)))  # fmt: skip
    log = pd.read_csv(selection_csv)
    panels = [("static", "(a) static selection"), ("randomized", "(b) randomized order"),
              ("sliding_window", "(c) sliding window")]  # fmt: skip
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.8), sharey=True)
    for ax, (name, title) in zip(axes, panels, strict=True):
        frame = selection.selection_frame(selection.schedule(ids, participation, shown, name, seed))
        if name == strategy:
            expected = frame[frame["round"] <= rounds].reset_index(drop=True)
            if not expected.equals(log[list(expected.columns)]):
                raise ValueError(f"{selection_csv}: log differs from the {name} schedule")
            title += f" (= run log, rounds 1-{rounds})"
        grid = np.zeros((n_collaborators, shown))
        for row in frame.itertuples(index=False):
            grid[row_of[int(row.collaborator)], int(row.round) - 1] = 2 if row.in_cycle else 1
        ax.imshow(grid, aspect="auto", cmap="Greys", vmin=0, vmax=2, origin="lower",
                  extent=(0.5, shown + 0.5, -0.5, n_collaborators - 0.5))  # fmt: skip
        counts = np.count_nonzero(grid, axis=1)
        ax.set_title(f"{title}\nparticipations per collaborator {counts.min()}-{counts.max()}",
                     fontsize=9)  # fmt: skip
        ax.set_xlabel("round")
        integer_ticks(ax.xaxis)
    axes[0].set_ylabel("collaborator (partition id)")
    step = max(1, n_collaborators // 11)
    axes[0].set_yticks(
        range(0, n_collaborators, step), [str(ids[i]) for i in range(0, n_collaborators, step)]
    )
    fig.suptitle(f"Collaborator selection, K={n_collaborators}, rho={participation}, "
                 "grey = window padding from the next permutation", fontsize=10)  # fmt: skip
    fig.tight_layout()  # the title clear of the two-line panel titles
    save_figure(fig, png_path)


def figure4(run_dirs: Sequence[str | Path], png_path: str | Path) -> None:
    """Fig. 4: Dice (WT, TC, ET, mean over labels) and projected convergence score per round,
    for each method the mean over its seeds with its interval as a band (`shown_interval`: Dice
    on the logit scale; none from fewer than `MIN_SEEDS` seeds, the count in the legend)."""
    panels = [("dice_WT", "Dice WT"), ("dice_TC", "Dice TC"), ("dice_ET", "Dice ET"),
              ("dice_mean_labels", "mean Dice labels 0/1/2/4"),
              ("convergence_score", "projected convergence score")]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.8))
    methods: dict[str, list[pd.DataFrame]] = {}
    for run in _sorted_runs(run_dirs):
        label = method_label(wildcards_from_path("fets", run))
        methods.setdefault(label, []).append(pd.read_csv(run / "rounds.csv"))
    for label, seeds in methods.items():
        for ax, (column, _) in zip(axes, panels, strict=True):
            per_round = pd.concat([r.set_index("round")[column] for r in seeds], axis=1)
            bounds = UNIT if column.startswith("dice") else None
            bands = np.array([shown_interval(row, bounds) for row in per_round.to_numpy()])
            name = label if len(seeds) >= MIN_SEEDS else f"{label} (n = {len(seeds)} seeds)"
            line = ax.plot(per_round.index, bands[:, 0], marker="o", markersize=3, label=name)
            if bounds is UNIT:  # a final Dice below the floor: the method did not learn
                grey_unlearned_points(ax, per_round.index[-1:], bands[-1:, 0], LEARNED_DICE,
                                      f"final Dice < {LEARNED_DICE:g}")  # fmt: skip
            if np.isfinite(bands[:, 1]).any():
                ax.fill_between(per_round.index, bands[:, 1], bands[:, 2], alpha=0.2,
                                color=line[0].get_color(), linewidth=0)  # fmt: skip
    for ax, (_, title) in zip(axes, panels, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("round")
        integer_ticks(ax.xaxis)
        ax.set_ylim(-0.02, 1.02)
    axes[-1].legend(*legend_handles(fig), fontsize=7, loc="best")
    fig.suptitle(f"fets: per-round scores, mean over seeds; {INTERVAL_METHOD}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, png_path)


# --- the ε0 × collaborators-per-round sweep: final validation Dice against the per-round
# budget ε0 for every aggregator and DP mode, one panel per m (collaborators per round), and its
# companion table with the noise σ per coordinate of every (mode, m, ε0).
#
# The runs are those of the grid blocks with a `sweep` over the participation ρ
# (`dpmed.fets.grid.sweep`; their aggregator wildcard is `<aggregator>-rho<ρ>`). m is read from
# each run's selection.csv (the collaborators of every round), σ from its rounds.csv (`sigma`:
# the round's largest per-coordinate noise std over its mechanisms, `sigma_min` the smallest).
# A DP run's `gain_fraction` is the share of its non-private baseline's gain over the untrained
# model it keeps, (Dice − Dice₀)/(Dice_none − Dice₀), Dice₀ the round-0 (untrained) Dice of the
# same runs and Dice_none that of the baseline (the aggregator without `dp_`: SimAgg for both
# DP-SimAgg modes, FedAvg for DP-FedAvg) at the same m: near 1 where collaborator-level DP is
# usable, near 0 where the noise leaves the model untrained.

SWEEP_METRIC, SWEEP_LABEL = "dice_WT", "final Dice WT"
SWEEP_METRICS = ("dice_WT", "dice_mean_labels")  # final-round validation Dice in the table
SWEEP_CELL = ["method", "aggregator", "dpmode", "rho", "m", "eps"]


def collaborators_per_round(selection_csv: str | Path) -> int:
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
        "m": collaborators_per_round(run / "selection.csv"),
        "eps": parse_eps(wc["eps"]),
        "seed": int(wc["seed"]),
        **{k: float(metrics[k]) for k in SWEEP_METRICS},
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
    name = aggregator.removeprefix(PRIVATE_PREFIX)
    return name if name != aggregator and name in aggregators() else None


def sweep_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (method, aggregator, dpmode, ρ, m, ε0): n_seeds, mean and 95 %
    t-interval of the final Dice WT and mean-over-labels Dice, σ per coordinate (min and max
    over rounds, mechanisms and seeds), the largest Δf, and `gain_fraction` (see the sweep section)
    of the mean Dice WT; non-private cells have σ, Δf and gain NaN."""
    table = summarize(runs, SWEEP_CELL, [*SWEEP_METRICS, "dice_WT_round0"])
    noise = runs.groupby(SWEEP_CELL, sort=False).agg(
        sigma_min=("sigma_min", "min"), sigma_max=("sigma_max", "max"),
        delta_f_max=("delta_f_max", "max"),
    ).reset_index()  # fmt: skip
    table = table.merge(noise, on=SWEEP_CELL, how="left")
    plain = table[[not DP_MODES[d].private for d in table["dpmode"]]]
    plain_means = plain[f"{SWEEP_METRIC}_mean"]
    reference = {(a, m): v for a, m, v in zip(plain["aggregator"], plain["m"], plain_means,
                                              strict=True)}  # fmt: skip
    base = np.array([reference.get((baseline(a), m), np.nan)
                     for a, m in zip(table["aggregator"], table["m"], strict=True)])  # fmt: skip
    floor = table[f"{SWEEP_METRIC}_round0_mean"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        table["gain_fraction"] = (table[f"{SWEEP_METRIC}_mean"].to_numpy(dtype=float) - floor) / (
            base - floor
        )
    table["eps"] = [format_eps(e) for e in table["eps"]]
    round0 = [f"{SWEEP_METRIC}_round0_{s}" for s in STATS if s != "mean"]
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
                mean, low, high = shown_interval(group[SWEEP_METRIC])
                ax.axhline(mean, color=colour, linestyle="--", label=f"{label} (no DP)")
                if math.isfinite(low):
                    ax.axhspan(low, high, color=colour, alpha=0.12, linewidth=0)
                continue
            cells = list(group.groupby("eps", sort=True)[SWEEP_METRIC])
            eps = np.array([e for e, _ in cells])
            bands = np.array([shown_interval(values) for _, values in cells])
            ax.plot(eps, bands[:, 0], marker="o", markersize=4, color=colour, label=label)
            note_seeds(ax, eps, bands[:, 0], [len(values) for _, values in cells])
            grey_unlearned_points(ax, eps, bands[:, 0], LEARNED_DICE, f"Dice < {LEARNED_DICE:g}")
            if np.isfinite(bands[:, 1]).any():
                ax.fill_between(eps, bands[:, 1], bands[:, 2], color=colour, alpha=0.2,
                                linewidth=0)  # fmt: skip
        ax.axhline(panel[f"{SWEEP_METRIC}_round0"].mean(), color="grey", linestyle=":",
                   label="untrained (round 0)")  # fmt: skip
        rho = ", ".join(f"{r:g}" for r in sorted(panel["rho"].unique()))
        ax.set_title(f"m = {m} collaborators per round (rho = {rho})", fontsize=9)
        ax.set_xscale("log")
        ax.set_xlim(*span)
        plain_log_ticks(ax.xaxis)
        ax.set_xlabel("per-round budget eps0")
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel(SWEEP_LABEL)
    handles, labels = legend_handles(fig)
    fig.legend(handles, labels, loc="lower center", fontsize=8, ncol=min(len(labels), 4),
               frameon=False, bbox_to_anchor=(0.5, -0.12))  # fmt: skip
    # two lines: one line of this length is wider than a two-panel figure
    fig.suptitle(f"fets: {SWEEP_LABEL} against eps0 after {runs['rounds'].max()} rounds, "
                 f"{runs['n_parameters'].max():,} parameters\nmean over seeds;\n{INTERVAL_METHOD}",
                 fontsize=10, y=1.0, va="bottom")  # fmt: skip
    save_figure(fig, png_path)
