"""Privacy–utility figures (dpmed.report.privacy_utility and the seg / xcal writers): the values
plotted, from hand-made run folders, against means and logit-scale t-intervals computed by
hand; intervals stay in the metric's range and none is drawn from fewer than 3 seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from dpmed.report.privacy_utility import figure, points
from dpmed.seg.report.main import privacy_utility_report as seg_report
from dpmed.seg.report.main import utility_runs as seg_utility_runs
from dpmed.xcal.report import privacy_utility_report as xcal_report

# Two-sided 95 % Student-t quantiles t(0.975, n - 1) from a table, n = 2 and 3.
T975 = {2: 12.706204736174698, 3: 4.302652729749464}


def hand_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean, and the t-interval on the logit scale back-transformed (values in (0, 1))."""
    n = len(values)
    z = [math.log(v / (1 - v)) for v in values]
    centre = sum(z) / n
    sd = math.sqrt(sum((v - centre) ** 2 for v in z) / (n - 1))
    half = T975[n] * sd / math.sqrt(n)
    expit = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    return sum(values) / n, expit(centre - half), expit(centre + half)


def seg_run(root: Path, model: str, clip: str, morph: str, eps: str, seed: int, dice: float):
    wc = dict(dataset="duke", model=model, clip=clip, morph=morph, eps=eps, seed=str(seed))
    path = root / "_".join(wc.values()) / "metrics.json"
    path.parent.mkdir(parents=True)
    body = dict(wildcards=wc, dice=dice, hd95=1.0, mae=0.1, val_dice=dice, train_seconds=1.0)
    path.write_text(json.dumps(body | {"hd95_empty": 0, "hd95_both_empty": 0}))
    return path


def xcal_run(root: Path, method: str, clients: int, eps: str, seed: int, f1: float, shift="iid"):
    folder = (
        root / f"results/xcal/bloodmnist/resnet18/{method}/{shift}/c{clients}/eps{eps}/seed{seed}"
    )
    folder.mkdir(parents=True)
    metrics = dict(dataset="bloodmnist", model="resnet18", method=method, shift=shift)
    metrics |= dict(clients=str(clients), eps=eps, f1=f1, accuracy=0.5, road=1.0)
    metrics |= dict(road_combined=0.1, road_random=0.5, epsilon=1.0, f1_per_eps=0.0)
    metrics |= dict(road_per_eps=0.0)
    times = {"step_seconds": 0.1, "forward_pair_seconds": 0.01}
    (folder / "metrics.json").write_text(json.dumps(metrics | times))
    return folder / "metrics.json"


def check_rows(table: pd.DataFrame, metric: str, expected: dict) -> None:
    """`expected`: (panel, line, eps) → the run values of that point."""
    got = table.set_index(["panel", "line", "eps"])
    assert sorted(got.index) == sorted(expected)
    for key, values in expected.items():
        row = got.loc[key]
        assert row["n_seeds"] == len(values)
        mean, low, high = hand_interval(values) if len(values) >= 3 else (None, math.nan, math.nan)
        assert row[f"{metric}_mean"] == pytest.approx(sum(values) / len(values), rel=1e-12)
        if len(values) >= 3:  # fewer seeds than a claim needs: no interval
            assert row[f"{metric}_ci_low"] == pytest.approx(low, rel=1e-9)
            assert row[f"{metric}_ci_high"] == pytest.approx(high, rel=1e-9)
        else:
            assert math.isnan(row[f"{metric}_ci_low"]) and math.isnan(row[f"{metric}_ci_high"])


def test_seg_points_are_the_seed_means_with_t_intervals(tmp_path):
    runs = [
        seg_run(tmp_path, "unet", "none", "none", "inf", 0, 0.80),
        seg_run(tmp_path, "unet", "none", "none", "inf", 1, 0.84),
        seg_run(tmp_path, "unet", "none", "none", "inf", 2, 0.83),
        seg_run(tmp_path, "unet", "flat", "none", "8", 0, 0.60),
        seg_run(tmp_path, "unet", "flat", "none", "8", 1, 0.70),
        seg_run(tmp_path, "unet", "flat", "none", "50", 0, 0.75),
        seg_run(tmp_path, "unet", "flat", "close-k3", "8", 0, 0.65),
        seg_run(tmp_path, "unetpp", "autos", "adaptive-v2", "8", 0, 0.5),
    ]
    png, csv = tmp_path / "out" / "f.png", tmp_path / "out" / "t.csv"
    seg_report(runs[::-1], png, csv)
    table = pd.read_csv(csv)
    unet, unetpp = "Duke · UNet", "Duke · UNet++"
    check_rows(
        table,
        "dice",
        {
            (unet, "No Morph", math.inf): [0.80, 0.84, 0.83],
            (unet, "DP (no morph): Flat", 8.0): [0.60, 0.70],
            (unet, "DP (no morph): Flat", 50.0): [0.75],
            (unet, "DP + Morph: Flat (close-k3)", 8.0): [0.65],
            (unetpp, "DP + Adaptive Morph (v2): AUTO-S", 8.0): [0.5],
        },
    )
    assert list(dict.fromkeys(table["panel"])) == [unetpp, unet]  # the paper's model order
    assert table[table["panel"] == unet]["line"].iloc[0] == "No Morph"  # reference first
    assert png.exists() and png.with_suffix(".pdf").exists()
    assert "<table" in csv.with_suffix(".html").read_text()
    first = png.read_bytes(), csv.read_bytes()
    seg_report(runs, png, csv)  # input order does not matter; bytes are identical
    assert (png.read_bytes(), csv.read_bytes()) == first


def test_xcal_points_are_the_seed_means_of_the_iid_runs(tmp_path):
    runs = [
        xcal_run(tmp_path, "nondp", 3, "inf", 0, 0.9),
        xcal_run(tmp_path, "nondp", 3, "inf", 1, 0.8),
        xcal_run(tmp_path, "static", 3, "5", 0, 0.5),
        xcal_run(tmp_path, "static", 3, "5", 1, 0.6),
        xcal_run(tmp_path, "static", 3, "5", 2, 0.7),
        xcal_run(tmp_path, "static", 5, "5", 0, 0.4),
        xcal_run(tmp_path, "xcal", 3, "0.5", 0, 0.3),
        xcal_run(tmp_path, "centralized", 1, "5", 0, 0.55),
        xcal_run(tmp_path, "static", 3, "5", 3, 0.0, shift="label"),  # not IID: left out
    ]
    csv = tmp_path / "out" / "t.csv"
    xcal_report(runs, tmp_path / "out" / "f.png", csv)
    panel = "bloodmnist · resnet18"
    check_rows(
        pd.read_csv(csv),
        "f1",
        {
            (panel, "nondp · 3 clients", math.inf): [0.9, 0.8],
            (panel, "static · 3 clients", 5.0): [0.5, 0.6, 0.7],
            (panel, "static · 5 clients", 5.0): [0.4],
            (panel, "xcal · 3 clients", 0.5): [0.3],
            (panel, "centralized · 1 client", 5.0): [0.55],
        },
    )


def test_the_figure_draws_a_line_per_method_and_a_reference_per_non_private_one():
    runs = pd.DataFrame(
        {
            "panel": ["p"] * 5,
            "line": ["ref", "ref", "dp", "dp", "dp"],
            "eps": [math.inf, math.inf, 1.0, 1.0, 10.0],
            "value": [0.9, 0.7, 0.2, 0.4, 0.5],
        }
    )
    fig = figure(points(runs), "u", "t")
    ax = fig.axes[0]
    line = [c for c in ax.containers if c.get_label() == "dp"][0].lines[0]
    assert list(line.get_xdata()) == [1.0, 10.0]
    assert list(line.get_ydata()) == pytest.approx([0.3, 0.5])
    reference = [ln for ln in ax.get_lines() if ln.get_label() == "ref (ε = ∞)"][0]
    assert list(reference.get_ydata()) == pytest.approx([0.8, 0.8])
    assert ax.get_xscale() == "log"
    plt.close(fig)


def test_a_panel_without_private_runs_is_named_not_drawn(tmp_path):
    """A panel holding only the non-private reference shows nothing of privacy vs utility:
    it is dropped and the title names it; with no private run anywhere every panel stays,
    saying why."""
    runs = pd.DataFrame(
        {
            "panel": ["dp", "dp", "ref only"],
            "line": ["a", "a", "nondp"],
            "eps": [0.5, 50.0, math.inf],
            "value": [0.3, 0.6, 0.9],
        }
    )
    fig = figure(points(runs), "u", "t")
    assert [ax.get_title() for ax in fig.axes] == ["dp"]
    assert "not drawn, no private run in the grid: ref only" in fig._suptitle.get_text()
    plt.close(fig)
    fig = figure(points(runs[runs["panel"] == "ref only"]), "u", "t")
    assert [ax.get_title() for ax in fig.axes] == ["ref only"]
    assert "no private run" in fig.axes[0].texts[0].get_text()
    plt.close(fig)


def test_saving_a_figure_with_an_empty_panel_fails_and_names_it(tmp_path):
    from dpmed.report.style import save_figure

    fig, axes = plt.subplots(1, 3)
    axes[0].plot([0, 1], [0, 1])
    axes[1].set_title("nothing here")
    axes[2].axis("off")  # a hidden spare panel is fine
    with pytest.raises(ValueError, match=r"empty panel\(s\) \['nothing here'\]"):
        save_figure(fig, tmp_path / "f.png")
    assert not (tmp_path / "f.png").exists()


def drawn_intervals(ax: plt.Axes) -> list[tuple[float, float]]:
    """(lower, upper) of every error bar drawn in `ax` (NaN-free segments only)."""
    spans = []
    for container in ax.containers:
        for collection in getattr(container, "lines", (None, None, ()))[2]:
            for segment in collection.get_segments():
                ys = np.asarray(segment, dtype=float).reshape(-1, 2)[:, 1]
                if ys.size and np.isfinite(ys).all():
                    spans.append((float(ys.min()), float(ys.max())))
    return spans


def test_two_seeds_draw_no_interval_and_say_so(tmp_path):
    # two seeds at 0.45 and 1.0: the t-interval over two seeds drew Dice above 1
    runs = [
        seg_run(tmp_path, "unet", "flat", "none", "50", 0, 0.45),
        seg_run(tmp_path, "unet", "flat", "none", "50", 1, 1.0),
    ]
    data = points(seg_utility_runs(runs))
    fig = figure(data, "test Dice", "t")
    ax = fig.axes[0]
    assert drawn_intervals(ax) == []
    assert [t.get_text() for t in ax.texts] == ["no interval: n = 2 seeds per point (< 3)"]
    plt.close(fig)


def test_bounded_intervals_stay_in_the_metrics_range(tmp_path):
    runs = [
        seg_run(tmp_path, "unet", "flat", "none", "50", seed, dice)
        for seed, dice in enumerate([0.45, 1.0, 0.99])
    ]
    fig = figure(points(seg_utility_runs(runs)), "test Dice", "t")
    spans = drawn_intervals(fig.axes[0])
    assert len(spans) == 1 and 0.0 <= spans[0][0] < spans[0][1] <= 1.0
    assert not fig.axes[0].texts  # three seeds: the interval, no count
    plt.close(fig)


def test_points_that_did_not_learn_are_greyed_and_classification_panels_show_chance(tmp_path):
    runs = [xcal_run(tmp_path, "static", 3, "5", s, 0.13) for s in range(3)]  # K = 8: 1.5/K
    runs += [xcal_run(tmp_path, "static", 3, "50", s, 0.7) for s in range(3)]
    csv = tmp_path / "out" / "t.csv"
    figures = []
    import dpmed.xcal.report as module

    original = module.save_figure
    module.save_figure = lambda fig, path: figures.append(fig)
    try:
        xcal_report(runs, tmp_path / "out" / "f.png", csv)
    finally:
        module.save_figure = original
    (ax,) = figures[0].axes
    grey = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "lightgrey"]
    assert len(grey) == 1 and list(grey[0].get_xdata()) == [5.0]  # only the run at 0.13
    # greyed, the point keeps its series' marker and colour: methods stay told apart
    series = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "none"]
    looks = [(ln.get_marker(), ln.get_color()) for ln in series]
    assert looks == [(grey[0].get_marker(), grey[0].get_markeredgecolor())]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "did not learn (F1 < 1.5/K)" in labels and "chance (1/K)" in labels
    (chance,) = [ln for ln in ax.get_lines() if ln.get_label() == "chance (1/K)"]
    assert list(chance.get_ydata()) == pytest.approx([1 / 8, 1 / 8])
    fig = figures[0]
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "5" in ticks and "50" in ticks  # plain log-ε ticks, not 5×10⁰
    plt.close(fig)


def test_saving_a_figure_with_an_only_hidden_panel_fails(tmp_path):
    from dpmed.report.style import save_figure

    fig, axes = plt.subplots(1, 3)
    axes[0].plot([0, 1], [0, 1])
    axes[1].plot([math.nan, math.nan], [math.nan, math.nan], label="all NaN")
    axes[1].set_title("only NaN")
    axes[2].plot([0, 1], [1, 0], visible=False)
    axes[2].text(0.5, 0.5, "")
    axes[2].set_title("only invisible")
    with pytest.raises(ValueError, match=r"empty panel\(s\) \['only NaN', 'only invisible'\]"):
        save_figure(fig, tmp_path / "f.png")
    assert not (tmp_path / "f.png").exists()


def test_saving_a_figure_with_a_fully_overdrawn_legend_series_fails(tmp_path):
    from dpmed.report.style import hidden_series, save_figure

    fig, (ax, ok) = plt.subplots(1, 2)
    ax.plot([1, 2], [0.3, 0.4], "o-", color="C0", label="xcal")
    ax.plot([1, 2], [0.3, 0.4], "o-", color="C1", label="xcal-random")  # drawn on top
    ax.legend()
    ok.plot([1, 2], [0.3, 0.4], "o-", label="a")
    ok.plot([1, 2], [0.3, 0.4], "s--", mfc="none", label="b")  # distinct: both show
    ok.plot([1, 2], [0.5, 0.4], "o-", label="c")  # other points
    assert hidden_series(ax) == [("xcal", "xcal-random")] and hidden_series(ok) == []
    ok.bar([1, 2], [math.nan, math.nan], label="morph")  # in the legend, drawn nowhere
    ok.plot([1, 2], [math.nan, math.nan], label="nan line")
    assert sorted(hidden_series(ok)) == [("morph", "nothing drawn"), ("nan line", "nothing drawn")]
    with pytest.raises(ValueError, match=r"\[\('xcal', 'xcal-random'\)\]"):
        save_figure(fig, tmp_path / "f.png")
    assert not (tmp_path / "f.png").exists()


def test_equal_methods_stay_visible_and_four_panels_leave_no_blank_slot(tmp_path):
    from dpmed.report.style import hidden_series

    runs = pd.DataFrame(
        {
            "panel": ["a", "a", "b", "c", "d"],
            "line": ["xcal", "xcal-random", "x", "x", "x"],
            "eps": [1.0, 1.0, 1.0, 1.0, 1.0],
            "value": [0.3, 0.3, 0.5, 0.5, 0.5],
        }
    )
    fig = figure(points(runs), "u", "t")
    assert len(fig.axes) == 4 and fig.axes[0].get_subplotspec().get_gridspec().ncols == 2
    assert hidden_series(fig.axes[0]) == []  # same point, distinct markers
    plt.close(fig)


def test_the_scale_mark_is_drawn_on_synthetic_runs_only(tmp_path, monkeypatch):
    from dpmed.report import style

    monkeypatch.setitem(style.SCALE, "tag", "")
    style.set_scale({"duke": {"raw": "synthetic"}, "umn": {"raw": "synthetic"}})
    assert style.SCALE["tag"] == "synthetic data · reduced scale"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    texts = []
    monkeypatch.setattr(fig, "savefig", lambda *a, **k: texts.append(list(fig.texts)))
    style.save_figure(fig, tmp_path / "f.png")
    assert [t.get_text() for t in texts[0]] == ["synthetic data · reduced scale"]
    style.set_scale({"duke": {"raw": "/data/duke"}, "umn": {"raw": "synthetic"}})
    assert style.SCALE["tag"] == "synthetic data (umn) · reduced scale"
    style.set_scale({"duke": {"raw": "/data/duke"}})
    assert style.SCALE["tag"] == ""


def test_one_seed_points_get_one_note_per_panel_not_a_label_each():
    """Twelve one-seed points in two calls: one corner note, no per-point label piling up;
    a panel whose counts differ names each point's count."""
    import matplotlib.pyplot as plt

    from dpmed.report.style import note_seeds

    fig, ax = plt.subplots()
    for offset in (0, 6):
        note_seeds(ax, range(offset, offset + 6), [0.5] * 6, [1] * 6)
    assert [t.get_text() for t in ax.texts] == ["no interval: n = 1 seed per point (< 3)"]
    note_seeds(ax, [20], [0.4], [2])
    texts = [t.get_text() for t in ax.texts]
    assert texts[0] == "no interval: n = 1 or 2 seeds per point (< 3)"
    assert texts[1:] == ["n = 2"]
    note_seeds(ax, [30], [0.4], [5])  # enough seeds: nothing added
    assert len(ax.texts) == 2
    plt.close(fig)


def test_a_non_private_reference_that_did_not_learn_is_grey_and_says_so(tmp_path):
    runs = [
        seg_run(tmp_path, "unet", "flat", "none", "50", seed, dice)
        for seed, dice in enumerate([0.6, 0.62, 0.61])
    ] + [seg_run(tmp_path, "unet", "none", "none", "inf", seed, 0.05) for seed in range(3)]
    fig = figure(points(seg_utility_runs(runs)), "test Dice", "t", floors={"Duke · UNet": 0.1},
                 rule="Dice < 0.1")  # fmt: skip
    ax = fig.axes[0]
    (reference,) = [line for line in ax.lines if "ε = ∞" in line.get_label()]
    assert reference.get_label().endswith("did not learn)")
    assert reference.get_color() == "dimgrey"
    plt.close(fig)


def test_a_figure_title_drawn_over_a_panel_title_is_refused(tmp_path):
    """A two-line figure title without room overlapped the panel titles (seg Figs. 3-5, 9,
    fets Fig. 3): save_figure names them; with the layout made, the figure saves."""
    from dpmed.report.style import save_figure

    for layout in (False, True):
        fig, axes = plt.subplots(1, 2, figsize=(6, 3))
        for ax, name in zip(axes, ("UNet++", "UNet"), strict=True):
            ax.plot([0, 1], [0, 1])
            ax.set_title(name)
        fig.suptitle("a figure title as wide as the figure, over both panels\nand a second line")
        if layout:
            fig.tight_layout()
            save_figure(fig, tmp_path / "f.png")
            assert (tmp_path / "f.png").exists()
        else:
            with pytest.raises(ValueError, match=r"overlaps the panel title\(s\) \['UNet\+\+'"):
                save_figure(fig, tmp_path / "f.png")
