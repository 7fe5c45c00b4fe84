"""The xcal tables and figures read the paper's ROAD (%) with the combined score beside it."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpmed.xcal.report import (
    CONTROL_LABEL,
    ROAD_LABEL,
    ablation_figure,
    ablation_table,
    clients_table,
    collect,
    efficiency_table,
    main_table,
    runtime_table,
    trajectories_figure,
)

PERCENTAGES = [0.2, 0.5]


def _run(
    root: Path,
    method: str,
    road: float,
    combined: float,
    seed: int = 0,
    f1: float = 0.5,
    clients: int = 3,
) -> Path:
    """A run folder with the files the report reads (2 rounds, ROAD in both)."""
    folder = root / f"results/xcal/bloodmnist/resnet18/{method}/iid/c{clients}/eps1/seed{seed}"
    folder.mkdir(parents=True)
    metrics = {
        "dataset": "bloodmnist",
        "model": "resnet18",
        "method": method,
        "shift": "iid",
        "clients": str(clients),
        "eps": "1",
        "f1": f1,
        "accuracy": 0.6,
        "road": road,
        "road_combined": combined,
        "road_random": 5.0,
        "epsilon": 0.9,
        "f1_per_eps": 0.1,
        "road_per_eps": (road - 10.0) / 0.5,
        "step_seconds": 0.01,
        "forward_pair_seconds": 0.002,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    pd.DataFrame(
        {
            "round": [1, 2],
            "f1": [0.4, 0.5],
            "epsilon": [0.4, 0.9],
            "eps_spent": [0.4, 0.9],
            "road": [10.0, road],
        }
    ).to_csv(folder / "rounds.csv", index=False)
    curves = {
        "percentages": PERCENTAGES,
        "morf_drop": [road / 2, road],
        "lerf_drop": [1.0, 2.0],
        "random": {"road": 5.0, "morf_drop": [3.0, 7.0], "lerf_drop": [3.0, 7.0], "combined": 0},
    }
    (folder / "road.json").write_text(json.dumps(curves))
    return folder


@pytest.fixture
def frame(tmp_path: Path) -> pd.DataFrame:
    return collect([_run(tmp_path, "static", 15.0, 0.05), _run(tmp_path, "xcal", 80.0, 0.3)])


def test_tables_carry_road_in_percent_and_the_combined_score(frame):
    main = main_table(frame).set_index("method")
    assert main.loc["xcal", "road_mean"] == 80.0 and main.loc["xcal", "road_combined_mean"] == 0.3
    assert main.loc["static", "road_mean"] == 15.0
    assert main.loc["static", "road_combined_mean"] == 0.05
    assert main.loc["xcal", "road_random_mean"] == 5.0
    assert main.loc["xcal", "n_seeds"] == 1 and np.isnan(main.loc["xcal", "road_ci_low"])
    efficiency = efficiency_table(frame).set_index("method")
    assert efficiency.loc["xcal", "road_per_eps_mean"] == pytest.approx(140.0)
    ablation = ablation_table(frame)
    assert list(ablation[["road_mean", "road_combined_mean"]].iloc[0]) == [80.0, 0.3]


def test_trajectories_plot_road_in_percent_and_the_final_morf_lerf_curves(frame):
    fig = trajectories_figure(frame)
    f1_ax, road_ax, eps_ax, curve_ax = fig.axes
    assert road_ax.get_ylabel() == ROAD_LABEL
    assert [list(line.get_ydata()) for line in road_ax.get_lines()] == [[10.0, 15.0], [10.0, 80.0]]
    # against the round (a run whose ε is flat from round 1 drew a vertical line against ε),
    # the proven ε in a panel of its own on a log axis
    runs = [line for line in f1_ax.get_lines() if not line.get_label().startswith("chance")]
    assert len(runs) == 2 and all(list(line.get_xdata()) == [1, 2] for line in runs)
    assert [list(line.get_ydata()) for line in eps_ax.get_lines()] == [[0.4, 0.9], [0.4, 0.9]]
    assert eps_ax.get_yscale() == "log"
    lines = {line.get_label(): line for line in curve_ax.get_lines()}
    morf = next(v for k, v in lines.items() if k.startswith("xcal") and k.endswith("MoRF"))
    np.testing.assert_allclose(morf.get_xdata(), [20.0, 50.0])
    np.testing.assert_allclose(morf.get_ydata(), [40.0, 80.0])
    assert sum(k.endswith("LeRF") for k in lines) == 2
    baseline = next(v for k, v in lines.items() if k.startswith("xcal") and k.endswith("random"))
    np.testing.assert_allclose(baseline.get_ydata(), [3.0, 7.0])
    plt.close(fig)


def test_tables_give_intervals_over_seeds_and_paired_tests_against_static(tmp_path):
    f1 = {"static": [0.50, 0.56, 0.52], "xcal": [0.58, 0.60, 0.59]}
    runs = [
        _run(tmp_path, method, 20.0 + seed, 0.1, seed=seed, f1=value, clients=clients)
        for method, values in f1.items()
        for seed, value in enumerate(values)
        for clients in (3, 10)
    ]
    frame = collect(runs)
    main = main_table(frame).set_index(["method", "clients"])
    xcal = main.loc[("xcal", 3)]
    assert xcal["n_seeds"] == 3 and xcal["f1_mean"] == pytest.approx(np.mean(f1["xcal"]))
    want = stats.t.interval(0.95, 2, loc=np.mean(f1["xcal"]), scale=stats.sem(f1["xcal"]))
    assert (xcal["f1_ci_low"], xcal["f1_ci_high"]) == pytest.approx(want)
    p = stats.ttest_rel(f1["xcal"], f1["static"]).pvalue
    assert xcal["f1_p_vs_static"] == pytest.approx(p, rel=1e-12)
    assert np.isnan(xcal["f1_p_vs_agp"])  # no AGP runs
    assert np.isnan(xcal["road_p_vs_static"])  # identical ROAD per seed: no spread
    assert np.isnan(main.loc[("static", 3), "f1_p_vs_static"])
    clients = clients_table(frame).set_index("method")
    assert clients.loc["xcal", "f1_c10_p_vs_static"] == pytest.approx(p, rel=1e-12)
    assert clients.loc["xcal", "f1_c3_ci_high"] == pytest.approx(want[1])
    assert clients.loc["static", "n_seeds_c3"] == 3


def test_runtime_table_gives_the_t_interval_over_runs_and_ratios_of_means(tmp_path):
    runs = [
        _run(tmp_path, method, 20.0, 0.1, seed=seed)
        for method in ("nondp", "static", "xcal", "xcal-logit")
        for seed in range(2)
    ]
    frame = collect(runs)
    seconds = {"nondp": [1.0, 1.2], "static": [2.0, 2.4], "xcal": [3.0, 3.2, 3.6, 3.8]}
    frame["step_seconds"] = seconds["nondp"] + seconds["static"] + seconds["xcal"]
    row = runtime_table(frame).iloc[0]
    x = seconds["xcal"]  # xcal and xcal-logit pooled
    want = stats.t.interval(0.95, 3, loc=np.mean(x), scale=stats.sem(x))
    assert row["xcal_n_runs"] == 4 and row["xcal_s"] == pytest.approx(3.4)
    assert (row["xcal_s_ci_low"], row["xcal_s_ci_high"]) == pytest.approx(want)
    assert row["xcal_over_static"] == pytest.approx(3.4 / 2.2)
    assert row["static_over_nondp"] == pytest.approx(2.0)
    # both overhead measures over the static step: the paper's two inference forwards, ours
    assert row["two_forwards_s"] == pytest.approx(0.002)
    assert row["paper_overhead_pct_two_forwards"] == pytest.approx(100 * 0.002 / 2.2)
    assert row["ours_overhead_pct_xcal_step"] == pytest.approx(100 * (3.4 / 2.2 - 1))


def test_runtime_table_keeps_the_random_control_out_of_xcal(tmp_path):
    runs = [_run(tmp_path, method, 20.0, 0.1) for method in ("static", "xcal", "xcal-random")]
    frame = collect(runs)
    frame["step_seconds"] = [2.0, 3.0, 9.0]
    row = runtime_table(frame).iloc[0]
    assert row["xcal_n_runs"] == 1 and row["xcal_s"] == pytest.approx(3.0)


def test_efficiency_table_says_where_eps_did_not_move(tmp_path):
    runs = [_run(tmp_path, method, 20.0, 0.1) for method in ("static", "xcal")]
    metrics = runs[1] / "metrics.json"
    metrics.write_text(json.dumps(json.loads(metrics.read_text()) | {"f1_per_eps": None}))
    table = efficiency_table(collect(runs)).set_index("method")
    assert table.loc["static", "f1_slope_runs"] == 1 and table.loc["static", "note"] == ""
    assert table.loc["xcal", "f1_slope_runs"] == 0 and "no slope" in table.loc["xcal", "note"]


def test_ablation_table_sets_the_random_control_beside_the_presets(tmp_path):
    runs = [
        _run(tmp_path, method, road, 0.1)
        for method, road in (("static", 10.0), ("xcal", 30.0), ("xcal-logit", 20.0),
                             ("xcal-random", 25.0))
    ]  # fmt: skip
    table = ablation_table(collect(runs)).set_index("preset")
    assert list(table.index) == ["balanced", "logit", CONTROL_LABEL]
    assert table.loc[CONTROL_LABEL, "road_mean"] == 25.0


def test_ablation_figure_f1_intervals_stay_in_range_and_two_seeds_draw_none(tmp_path):
    runs = [_run(tmp_path, "xcal", 30.0, 0.1, seed=s, f1=f) for s, f in enumerate([0.3, 0.99, 1.0])]
    runs += [
        _run(tmp_path, "xcal-logit", 20.0, 0.1, seed=s, f1=f) for s, f in enumerate([0.4, 1.0])
    ]
    fig = ablation_figure(collect(runs))
    f1_panel = fig.axes[0]
    balanced, logit = [c for c in f1_panel.containers if hasattr(c, "errorbar")]
    (bar,) = balanced.errorbar.lines[2][0].get_segments()
    assert 0.0 <= np.min(bar[:, 1]) and np.max(bar[:, 1]) <= 1.0  # the t-interval ran to 1.6
    assert np.max(bar[:, 1]) > np.mean([0.3, 0.99, 1.0])
    drawn = [np.asarray(s, float).reshape(-1, 2) for s in logit.errorbar.lines[2][0].get_segments()]
    assert not any(s.size and np.isfinite(s).all() for s in drawn)  # two seeds: none
    assert [t.get_text() for t in f1_panel.texts] == ["no interval: n = 2 seeds per point (< 3)"]
    plt.close(fig)


def test_trajectories_mark_chance_and_tick_rounds_and_eps_plainly(frame):
    fig = trajectories_figure(frame)
    fig.canvas.draw()
    f1_ax, road_ax, eps_ax, _ = fig.axes
    (chance,) = [line for line in f1_ax.get_lines() if line.get_label() == "chance (1/K)"]
    assert list(chance.get_ydata()) == pytest.approx([1 / 8, 1 / 8])  # bloodmnist: K = 8
    for ax in (f1_ax, road_ax, eps_ax):  # two rounds: no tick at 1.5
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
    labels = [t.get_text() for t in eps_ax.get_yticklabels() if t.get_text()]
    assert labels and all("10^" not in t and "times" not in t for t in labels)
    assert all(float(t) > 0 for t in labels)  # plain numbers such as 0.5, not 5×10⁻¹
    plt.close(fig)


def test_trajectories_of_runs_with_equal_eps_are_both_visible(tmp_path):
    from dpmed.report.style import hidden_series

    # static DP-SGD and AGP-DP spend the same ε per round: the same points in the ε panel
    frame = collect([_run(tmp_path, "static", 15.0, 0.05), _run(tmp_path, "agp-dp", 20.0, 0.1)])
    fig = trajectories_figure(frame)
    eps_ax = fig.axes[2]
    first, second = eps_ax.get_lines()
    assert list(first.get_ydata()) == list(second.get_ydata())
    eps_ax.legend()
    assert hidden_series(eps_ax) == []
    plt.close(fig)
