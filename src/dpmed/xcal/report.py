"""Tables and figures of the xcal study (paper 001 §6–8), from the grid's run folders.

Every function reads the runs it is given (metrics.json, rounds.csv, road.json, gradcam.npz of
each folder) and writes through `dpmed.report.style`, so identical runs give identical files.
ROAD is the paper's score (`dpmed.explain.road`): the mean confidence drop in % when the most
salient pixels are removed (MoRF); `road_combined` is the (LeRF − MoRF) / 2 score beside it.
Tables (results/tables/<name>.csv + .md; xcal_runtime, measured, under results/measured/): each
value the mean over seeds with its 95 % t-interval (`dpmed.report.intervals.summarize`:
`n_seeds`, `<m>_mean`, `<m>_ci_low`, `<m>_ci_high`), comparisons as paired t-tests over seeds
(`<m>_p_vs_<baseline>`). Figures: results/figures/<name>.png + .pdf. Each builder's docstring
says what its table or figure holds; captions/<name>.rst says it to the report's reader.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dpmed.config.grid import wildcards_from_path  # noqa: E402
from dpmed.config.wildcards import parse_eps  # noqa: E402
from dpmed.data.registry import DATASET_REGISTRY  # noqa: E402
from dpmed.report import privacy_utility  # noqa: E402
from dpmed.report.intervals import UNIT, error_bars, paired_tests, summarize  # noqa: E402
from dpmed.report.style import (  # noqa: E402
    chance_line,
    grey_unlearned,
    integer_ticks,
    note_seeds,
    plain_log_ticks,
    save_figure,
    series_look,
    write_table,
)
from dpmed.xcal.claims import CHANCE_FACTOR  # noqa: E402
from dpmed.xcal.methods import (  # noqa: E402
    BASELINE,
    NON_PRIVATE,
    PROPOSED,
    RANDOM_CONTROL,
    method_rank,
    split_method,
)
from dpmed.xcal.shifts import POOLED, SHIFTS  # noqa: E402

KEYS = ["dataset", "model", "method", "shift", "clients", "eps"]
ROAD_LABEL = "ROAD: MoRF confidence drop (%)"
# The metrics.json values the tables read (road: the paper's ROAD in %; road_combined beside it).
METRICS = [
    "f1", "accuracy", "road", "road_combined", "road_random", "epsilon", "f1_per_eps",
    "road_per_eps",
]  # fmt: skip
TIMES = ["step_seconds", "forward_pair_seconds"]  # measured wall-clock (xcal_runtime)
# The client-count and shift comparisons (tables, figure, Grad-CAM pairs): the DP baseline
# against XCal-FL with its default preset.
COMPARED = [BASELINE, PROPOSED]
# The main table tests every method against these (paired over seeds): static DP-FL, AGP and the
# random-σ_t control (whether XCal-FL's signal matters beyond σ_t varying in its band).
MAIN_BASELINES = [BASELINE, "agp", RANDOM_CONTROL]
# The ablation's label for the random-σ_t control (it has no preset).
CONTROL_LABEL = "random sigma_t (control)"
TESTED = ["f1", "road"]  # the metrics of the paired tests


def collect(runs: Sequence[str | Path]) -> pd.DataFrame:
    """One row per run folder: wildcards (clients int, eps float, seed int from the folder
    name) and metrics.json values."""
    rows = []
    for run in runs:
        metrics = json.loads((Path(run) / "metrics.json").read_text())
        row = {k: metrics[k] for k in KEYS}
        row.update({k: metrics[k] for k in (*METRICS, *TIMES)})
        row["clients"] = int(row["clients"])
        row["eps"] = parse_eps(str(row["eps"]))
        row["seed"] = int(wildcards_from_path("xcal", run)["seed"])
        row["run"] = str(run)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*KEYS, *METRICS, *TIMES, "seed", "run"])
    if frame.empty:
        return frame.reset_index(drop=True)
    order = frame["method"].map(method_rank)
    frame = frame.assign(_m=order).sort_values(
        ["dataset", "model", "_m", "shift", "clients", "eps", "seed"], kind="stable"
    )
    return frame.drop(columns="_m").reset_index(drop=True)


def main_table(frame: pd.DataFrame) -> pd.DataFrame:
    """F1 / accuracy / ROAD (%) / combined ROAD / ROAD of random attributions (%, the
    baseline) / final proven ε of the IID runs (paper §6 tables),
    mean and 95 % t-interval over seeds, F1 and ROAD paired-tested against `MAIN_BASELINES`."""
    iid = frame[frame["shift"] == POOLED]
    cell = ["dataset", "model", "clients", "eps"]
    table = summarize(
        iid, ["dataset", "model", "method", "clients", "eps"],
        ["f1", "accuracy", "road", "road_combined", "road_random", "epsilon"],
    )  # fmt: skip
    for baseline in MAIN_BASELINES:
        tests = paired_tests(iid, cell, "method", baseline, TESTED)
        table = table.merge(tests, on=[*cell, "method"], how="left", validate="one_to_one")
    return table


def efficiency_table(frame: pd.DataFrame) -> pd.DataFrame:
    """ΔF1/Δε and ΔROAD/Δε (ROAD in %, so percentage points of confidence drop per unit ε)
    of the private runs, mean and 95 % t-interval over seeds. A slope is defined only where ε
    moved between the first and last round with a value (`dpmed.xcal.run.efficiency`):
    `f1_slope_runs` and `road_slope_runs` count the cell's runs that have one, and `note` says
    when a cell has none."""
    private = frame[np.isfinite(frame["eps"].astype(float))]
    table = summarize(private, KEYS, ["epsilon", "f1_per_eps", "road_per_eps"])
    counts = private.groupby(KEYS, sort=False)[["f1_per_eps", "road_per_eps"]].count()
    counts.columns = ["f1_slope_runs", "road_slope_runs"]
    table = table.merge(counts.reset_index(), on=KEYS, how="left", validate="one_to_one")
    flat = (table["f1_slope_runs"] == 0) | (table["road_slope_runs"] == 0)
    table["note"] = np.where(
        flat, "eps did not move between the first and last round with a value: no slope", ""
    )
    return table


def _pivot(frame: pd.DataFrame, over: str, index: list[str]) -> pd.DataFrame:
    """F1 and ROAD (%) with one group of columns per value of `over` (e.g. f1_c3_mean,
    f1_c3_ci_low, f1_c3_ci_high, n_seeds_c3 …; XCal-FL rows also f1_c3_p_vs_static)."""
    subset = frame[frame["method"].isin(COMPARED)]
    if subset.empty:
        return pd.DataFrame(columns=index)
    present = set(subset[over])
    values = [s for s in SHIFTS if s in present] if over == "shift" else sorted(present)
    cells = summarize(subset, [*index, over], TESTED)
    others = [k for k in index if k != "method"]
    tests = paired_tests(subset, [*others, over], "method", BASELINE, TESTED)
    cells = cells.merge(tests, on=[*index, over], how="left", validate="one_to_one")
    stats = ["n_seeds", *(f"{m}_{s}" for m in TESTED for s in ("mean", "ci_low", "ci_high"))]
    stats += [f"{m}_p_vs_{BASELINE}" for m in TESTED]
    rows = []
    for key, group in cells.groupby(index, sort=False):
        if group[over].nunique() < 2:
            continue
        row = dict(zip(index, key, strict=True))
        for v in values:
            hit = group[group[over] == v]
            label = f"c{v}" if over == "clients" else str(v)
            for stat in stats:
                metric, _, rest = stat.partition("_")
                name = f"{stat}_{label}" if stat == "n_seeds" else f"{metric}_{label}_{rest}"
                row[name] = hit[stat].iloc[0] if len(hit) else math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else index)


def clients_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Client-count effect (paper §6 'Client and distribution effects'): F1 and ROAD by client
    count (columns) per dataset × model × method × shift × ε, XCal-FL against static DP-FL."""
    return _pivot(frame, "clients", ["dataset", "model", "method", "shift", "eps"])


def shift_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Shift effect: F1 and ROAD by shift (columns: IID, label, covariate) per dataset × model ×
    method × clients × ε, XCal-FL against static DP-FL."""
    return _pivot(frame, "shift", ["dataset", "model", "method", "clients", "eps"])


def ablation_table(frame: pd.DataFrame) -> pd.DataFrame:
    """XCal-FL presets and the random-σ_t control (preset `CONTROL_LABEL`) × ε (IID): F1,
    ROAD (%) and combined ROAD (paper §7), mean and 95 % t-interval over seeds."""
    return summarize(_ablation_runs(frame), ABLATION_KEYS, ["f1", "road", "road_combined"])


ABLATION_KEYS = ["dataset", "model", "preset", "clients", "eps"]


def _ablation_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The IID XCal-FL and random-σ_t runs, each with its `preset`."""
    base = frame["method"].map(lambda m: split_method(m)[0])
    xcal = frame[base.isin([PROPOSED, RANDOM_CONTROL]) & (frame["shift"] == POOLED)]
    return xcal.assign(preset=xcal["method"].map(lambda m: split_method(m)[1] or CONTROL_LABEL))


def runtime_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean step seconds of nondp / static / xcal (any preset) over the federated IID runs of
    each dataset × model with the 95 % t-interval over those runs (`<m>_s_ci_low`,
    `<m>_s_ci_high`, `<m>_n_runs`), the ratios of the means (NaN where a method did not run),
    and XCal-FL's overhead over a static DP-SGD step both ways: paper 001 §8's measure,
    `paper_overhead_pct_two_forwards` = two inference-mode forward passes on the expected
    batch (`two_forwards_s`, timed in the static runs) over the static step, and ours,
    `ours_overhead_pct_xcal_step` = the measured XCal-FL step over the static step − 1."""
    methods = (NON_PRIVATE, BASELINE, PROPOSED)
    fed = frame[(frame["shift"] == POOLED) & (frame["clients"] > 1)]
    fed = fed.assign(base=fed["method"].map(lambda m: split_method(m)[0]))
    fed = fed[fed["base"].isin(methods)]
    cols = ["dataset", "model"]
    cols += [f"{m}_{s}" for m in methods for s in ("s", "s_ci_low", "s_ci_high", "n_runs")]
    ratios = [f"{BASELINE}_over_{NON_PRIVATE}", f"{PROPOSED}_over_{BASELINE}"]
    cols += [*ratios, "two_forwards_s", "paper_overhead_pct_two_forwards"]
    cols += ["ours_overhead_pct_xcal_step"]
    cells = summarize(fed, ["dataset", "model", "base"], TIMES)
    rows = []
    for (dataset, model), group in cells.groupby(["dataset", "model"], sort=True):
        row = {"dataset": dataset, "model": model}
        for method in methods:
            hit = group[group["base"] == method]
            found = len(hit) > 0
            for stat, column in (("s", "mean"), ("s_ci_low", "ci_low"), ("s_ci_high", "ci_high")):
                row[f"{method}_{stat}"] = hit[f"step_seconds_{column}"].iloc[0] if found else np.nan
            row[f"{method}_n_runs"] = int(hit["n_seeds"].iloc[0]) if found else 0
        static = group[group["base"] == BASELINE]
        row["two_forwards_s"] = (
            static["forward_pair_seconds_mean"].iloc[0] if len(static) else np.nan
        )
        t = {m: row[f"{m}_s"] for m in methods}
        row[ratios[0]] = t[BASELINE] / t[NON_PRIVATE]
        row[ratios[1]] = t[PROPOSED] / t[BASELINE]
        row["paper_overhead_pct_two_forwards"] = 100 * row["two_forwards_s"] / t[BASELINE]
        row["ours_overhead_pct_xcal_step"] = 100 * (t[PROPOSED] / t[BASELINE] - 1)
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def write_xcal_table(csv_path: str | Path, run_dirs: Sequence[str | Path], table: str) -> None:
    """Write table `table` (`xcal_main`, ..., `xcal_runtime`) from the run folders (a generated
    rule of `dpmed.xcal.outputs.REPORTS`)."""
    builders = {
        "xcal_main": main_table,
        "xcal_efficiency": efficiency_table,
        "xcal_clients": clients_table,
        "xcal_shift": shift_table,
        "xcal_ablation": ablation_table,
        "xcal_runtime": runtime_table,
    }
    write_table(builders[table](collect(run_dirs)), csv_path)


# ---------------------------------------------------------------------------------- figures


def chance(dataset: str) -> float:
    """Macro F1 of a classifier that guesses among the K classes of `dataset`: 1/K. The
    claims layer counts a run below `CHANCE_FACTOR` times it as one that did not learn."""
    return 1 / DATASET_REGISTRY[dataset].n_classes


UNLEARNED_RULE = f"F1 < {CHANCE_FACTOR:g}/K"


def _no_data(ax: plt.Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def trajectories_figure(frame: pd.DataFrame) -> plt.Figure:
    """Per private IID run, one row per dataset × model: F1, ROAD (%) and the ε spent so far
    (rounds.csv's `eps_spent`, the efficiencies' trajectory; log axis) against the round, and
    the final model's MoRF (solid) and LeRF (dotted) confidence drop (%) vs removed fraction,
    with the drop of uniform random attributions (dashed, faint): the baseline MoRF must
    beat."""
    private = frame[(frame["shift"] == POOLED) & np.isfinite(frame["eps"].astype(float))]
    combos = list(dict.fromkeys(zip(private["dataset"], private["model"], strict=True)))
    fig, axes = plt.subplots(
        max(1, len(combos)), 4, figsize=(19, 3.2 * max(1, len(combos))), squeeze=False
    )
    if not combos:
        _no_data(axes[0, 0], "no private IID runs")
        for ax in axes[0, 1:]:
            _no_data(ax, "")
    for (dataset, model), row_axes in zip(combos, axes, strict=True):
        runs = private[(private["dataset"] == dataset) & (private["model"] == model)]
        for i, (_, run) in enumerate(runs.iterrows()):
            rounds = pd.read_csv(Path(run["run"]) / "rounds.csv")
            road = json.loads((Path(run["run"]) / "road.json").read_text())
            # each run its own line style and hollow marker: runs with equal ε per round
            # (static DP-SGD and AGP-DP) are drawn on the same points and must both show
            look = series_look(i)
            line = {"color": f"C{i % 10}", "ms": 4, "marker": look["marker"], "mfc": "none"}
            label = f"{run['method']} ε={run['eps']:g} c{run['clients']}"  # finite: private
            style = {"linestyle": look["linestyle"], "label": label, **line}
            row_axes[0].plot(rounds["round"], rounds["f1"], **style)
            with_road = rounds.dropna(subset=["road"])
            row_axes[1].plot(with_road["round"], with_road["road"], **style)
            row_axes[2].plot(rounds["round"], rounds["eps_spent"], **style)
            removed = 100 * np.asarray(road["percentages"])
            row_axes[3].plot(removed, road["morf_drop"], "-", label=f"{label} MoRF", **line)
            row_axes[3].plot(removed, road["lerf_drop"], ":", label=f"{label} LeRF", **line)
            row_axes[3].plot(
                removed, road["random"]["morf_drop"], "--", label=f"{label} random",
                alpha=0.5, **line,
            )  # fmt: skip
        chance_line(row_axes[0], chance(dataset))
        row_axes[0].set(title=f"{dataset} / {model}: macro F1", xlabel="round", ylabel="macro F1")
        row_axes[1].set(title=f"{dataset} / {model}: ROAD", xlabel="round", ylabel=ROAD_LABEL)
        row_axes[2].set(
            title=f"{dataset} / {model}: ε spent", xlabel="round", ylabel="cumulative ε",
            yscale="log",
        )  # fmt: skip
        row_axes[3].set(
            title=f"{dataset} / {model}: final model",
            xlabel="pixels removed (%)",
            ylabel="confidence drop (%)",
        )
        for ax in row_axes[:3]:
            integer_ticks(ax.xaxis)
        plain_log_ticks(row_axes[2].yaxis)
        row_axes[0].legend(fontsize=7)
        row_axes[3].legend(fontsize=6)
    fig.tight_layout()
    return fig


def clients_shift_figure(frame: pd.DataFrame) -> plt.Figure:
    """F1 and ROAD vs number of clients (mean over seeds), one line per dataset × method ×
    shift (static, xcal)."""
    fed = frame[frame["method"].isin(COMPARED) & (frame["clients"] > 1)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if fed.empty:
        _no_data(axes[0], "no static/xcal runs")
        _no_data(axes[1], "")
        return fig
    for key, group in fed.groupby(["dataset", "model", "method", "shift", "eps"], sort=False):
        group = group.groupby("clients")[["f1", "road"]].mean().reset_index()
        style = "-" if key[2] == PROPOSED else "--"
        label = f"{key[0]} {key[1]} {key[2]} {key[3]} ε={key[4]:g}"
        axes[0].plot(group["clients"], group["f1"], style, marker="o", label=label)
        axes[1].plot(group["clients"], group["road"], style, marker="o", label=label)
    for k in sorted({DATASET_REGISTRY[d].n_classes for d in fed["dataset"]}):
        chance_line(axes[0], 1 / k, f"chance 1/K, K = {k}")
    for ax, name in zip(axes, ("macro F1", ROAD_LABEL), strict=True):
        ax.set(xlabel="clients", ylabel=name, xscale="log")
        ax.minorticks_off()
        ax.set_xticks(sorted(fed["clients"].unique()))
        ax.set_xticklabels([str(c) for c in sorted(fed["clients"].unique())])
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def ablation_figure(frame: pd.DataFrame) -> plt.Figure:
    """Grouped bars: F1 and ROAD per preset at each ε (one group per dataset × model × ε),
    mean over seeds with its interval as error bar (`error_bars`: F1 within [0, 1] on the
    logit scale, ROAD, unbounded below, a t-interval; none from fewer than 3 seeds, whose
    count is written instead)."""
    runs = _ablation_runs(frame)
    table = ablation_table(frame)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if table.empty:
        _no_data(axes[0], "no xcal runs")
        _no_data(axes[1], "")
        return fig
    keys = ["dataset", "model", "clients", "eps"]
    table = table.assign(group=[_group_label(*row) for row in table[keys].to_numpy()])
    groups = list(dict.fromkeys(table["group"]))
    presets = list(dict.fromkeys(table["preset"]))
    width = 0.8 / len(presets)
    for ax, metric, bounds in zip(axes, ("f1", "road"), (UNIT, None), strict=True):
        for i, preset in enumerate(presets):
            cells = {
                _group_label(*key): (*error_bars(cell[metric], bounds), len(cell))
                for key, cell in runs[runs["preset"] == preset].groupby(keys, sort=False)
            }
            bars = [cells.get(g, (np.nan, np.nan, np.nan, 0)) for g in groups]
            x = np.arange(len(groups)) + i * width
            values = [b[0] for b in bars]
            errors = [[b[1] for b in bars], [b[2] for b in bars]]
            drawn = ax.bar(x, values, width, yerr=errors, capsize=2, label=preset)
            note_seeds(ax, x, values, [b[3] for b in bars])
            if metric == "f1":
                floors = [CHANCE_FACTOR * chance(g.split("\n")[0]) for g in groups]
                for bar, floor in zip(drawn, floors, strict=True):
                    grey_unlearned(ax, [bar], floor, UNLEARNED_RULE)
        if metric == "f1":  # chance under each group of bars, 1/K of its dataset
            for j, group in enumerate(groups):
                span = (j - width / 2, j + len(presets) * width - width / 2)
                chance_line(ax, chance(group.split("\n")[0]), span=span)
        ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
        ax.set_xticklabels(groups, fontsize=6)
        ax.set_ylabel("macro F1" if metric == "f1" else ROAD_LABEL)
    handles = dict(zip(*reversed(axes[0].get_legend_handles_labels()), strict=True))
    axes[1].legend(list(handles.values()), list(handles), fontsize=7)
    fig.tight_layout()
    return fig


def _group_label(dataset: str, model: str, clients: int, eps: float) -> str:
    """A bar group of the ablation figure: dataset, model, ε and client count."""
    return f"{dataset}\n{model}\nε={eps:g} c{clients}"


def _pairs(frame: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """(static run, xcal run) with the same dataset, model, shift, clients and ε."""
    pairs = []
    static = frame[frame["method"] == BASELINE]
    xcal = frame[frame["method"] == PROPOSED]
    for _, s in static.iterrows():
        match = xcal[
            (
                xcal[["dataset", "model", "shift", "clients", "eps"]]
                == s[["dataset", "model", "shift", "clients", "eps"]]
            ).all(axis=1)
        ]
        if len(match):
            pairs.append((s, match.iloc[0]))
    return pairs


def gradcam_figure(frame: pd.DataFrame) -> plt.Figure:
    """Test images with the final models' Grad-CAM: static DP-FL vs XCal-FL (first pair per
    dataset; same images, so the maps compare directly)."""
    pairs = list({s["dataset"]: (s, x) for s, x in reversed(_pairs(frame))}.values())[::-1]
    if not pairs:
        fig, ax = plt.subplots(figsize=(4, 2))
        _no_data(ax, "no static/xcal pair")
        return fig
    n_ex = min(np.load(Path(pairs[0][0]["run"]) / "gradcam.npz")["cams"].shape[0], 4)
    fig, axes = plt.subplots(
        len(pairs) * 3, n_ex, figsize=(2 * n_ex, 6.2 * len(pairs)), squeeze=False
    )
    for p, (s, x) in enumerate(pairs):
        data = {
            name: np.load(Path(run["run"]) / "gradcam.npz")
            for name, run in zip(COMPARED, (s, x), strict=True)
        }
        for j in range(n_ex):
            image = data[BASELINE]["images"][j].transpose(1, 2, 0)
            image = image[..., 0] if image.shape[-1] == 1 else image
            axes[3 * p, j].imshow(image, cmap="gray" if image.ndim == 2 else None)
            axes[3 * p, j].set_title(
                f"{s['dataset']} label {int(data[BASELINE]['labels'][j])}", fontsize=7
            )
            for k, name in enumerate(COMPARED, start=1):
                ax = axes[3 * p + k, j]
                ax.imshow(image, cmap="gray" if image.ndim == 2 else None)
                ax.imshow(data[name]["cams"][j], cmap="jet", alpha=0.45, vmin=0, vmax=1)
                ax.set_title(
                    f"{name} ε={s['eps']:g} pred {int(data[name]['predictions'][j])}", fontsize=7
                )
        for ax in axes[3 * p : 3 * p + 3].ravel():
            ax.set_axis_off()
    fig.tight_layout()
    return fig


def write_xcal_figure(png_path: str | Path, run_dirs: Sequence[str | Path], figure: str) -> None:
    """Write figure `figure` (`xcal_trajectories`, ...) from the run folders (a generated rule
    of `dpmed.xcal.outputs.REPORTS`)."""
    builders = {
        "xcal_trajectories": trajectories_figure,
        "xcal_clients_shift": clients_shift_figure,
        "xcal_ablation": ablation_figure,
        "xcal_gradcam": gradcam_figure,
    }
    save_figure(builders[figure](collect(run_dirs)), png_path)


UTILITY_METRIC = "f1"  # the privacy–utility figure's y axis


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
            "value": runs[UTILITY_METRIC].astype(float).to_numpy(),
        }
    )


def privacy_utility_report(
    metrics_paths: Iterable[str | Path], png_path: str | Path, csv_path: str | Path
) -> None:
    """xcal_privacy_utility: test F1 against the target ε for every method of the IID runs
    (paper 001 §6), one panel per dataset × model, mean over seeds with the 95 % t-interval,
    the non-private runs (ε = ∞) as reference lines (`dpmed.report.privacy_utility`). Writes
    the figure (`png_path` + .pdf) and its plotted values (`csv_path` + twins: panel, line,
    eps, n_seeds, f1_mean, f1_ci_low, f1_ci_high)."""
    data = privacy_utility.points(utility_runs(metrics_paths))
    chances = {panel: chance(panel.split(" · ")[0]) for panel in data["panel"]}
    floors = {panel: CHANCE_FACTOR * level for panel, level in chances.items()}
    fig = privacy_utility.figure(
        data, "test F1", "xcal: test F1 vs ε (IID)", floors, UNLEARNED_RULE, chances
    )
    save_figure(fig, png_path)
    write_table(privacy_utility.named(data, UTILITY_METRIC), csv_path)
