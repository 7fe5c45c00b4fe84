"""The xcal tables and figures read the paper's ROAD (%) with the combined score beside it."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from dpmed.xcal.report import (
    ROAD_LABEL,
    ablation_table,
    collect,
    efficiency_table,
    main_table,
    trajectories_figure,
)

PERCENTAGES = [0.2, 0.5]


def _run(root: Path, method: str, road: float, combined: float) -> Path:
    """A run folder with the files the report reads (2 rounds, ROAD in both)."""
    folder = root / method
    folder.mkdir()
    metrics = {
        "dataset": "bloodmnist",
        "model": "resnet18",
        "method": method,
        "shift": "iid",
        "clients": "3",
        "eps": "1",
        "f1": 0.5,
        "accuracy": 0.6,
        "road": road,
        "road_combined": combined,
        "epsilon": 0.9,
        "f1_per_eps": 0.1,
        "road_per_eps": (road - 10.0) / 0.5,
        "step_seconds": 0.01,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    pd.DataFrame(
        {"round": [1, 2], "f1": [0.4, 0.5], "epsilon": [0.4, 0.9], "road": [10.0, road]}
    ).to_csv(folder / "rounds.csv", index=False)
    curves = {
        "percentages": PERCENTAGES,
        "morf_drop": [road / 2, road],
        "lerf_drop": [1.0, 2.0],
    }
    (folder / "road.json").write_text(json.dumps(curves))
    return folder


@pytest.fixture
def frame(tmp_path: Path) -> pd.DataFrame:
    return collect([_run(tmp_path, "static", 15.0, 0.05), _run(tmp_path, "xcal", 80.0, 0.3)])


def test_tables_carry_road_in_percent_and_the_combined_score(frame):
    main = main_table(frame).set_index("method")
    assert main.loc["xcal", "road"] == 80.0 and main.loc["xcal", "road_combined"] == 0.3
    assert main.loc["static", "road"] == 15.0 and main.loc["static", "road_combined"] == 0.05
    efficiency = efficiency_table(frame).set_index("method")
    assert efficiency.loc["xcal", "road_per_eps"] == pytest.approx(140.0)
    ablation = ablation_table(frame)
    assert list(ablation[["road", "road_combined"]].iloc[0]) == [80.0, 0.3]


def test_trajectories_plot_road_in_percent_and_the_final_morf_lerf_curves(frame):
    fig = trajectories_figure(frame)
    _, road_ax, curve_ax = fig.axes
    assert road_ax.get_ylabel() == ROAD_LABEL
    assert [list(line.get_ydata()) for line in road_ax.get_lines()] == [[10.0, 15.0], [10.0, 80.0]]
    lines = {line.get_label(): line for line in curve_ax.get_lines()}
    morf = next(v for k, v in lines.items() if k.startswith("xcal") and k.endswith("MoRF"))
    np.testing.assert_allclose(morf.get_xdata(), [20.0, 50.0])
    np.testing.assert_allclose(morf.get_ydata(), [40.0, 80.0])
    assert sum(k.endswith("LeRF") for k in lines) == 2
    plt.close(fig)
