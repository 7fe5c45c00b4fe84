"""Paper 002 Fig. 2, Table 2, Figs. 11–12 from hand-made run files (values computed by hand)."""

from __future__ import annotations

import csv
import json
import math

import matplotlib.colors as mcolors
import pandas as pd
import pytest
from matplotlib.container import BarContainer
from scipy import stats

import dpmed.seg.report.adaptive as seg_adaptive
from dpmed.report.style import write_table
from dpmed.seg.diagnostics import MORPH_COLUMNS
from dpmed.seg.report.ablation import lr_clip_figure, quantile_table
from dpmed.seg.report.adaptive import OPERATION_COLOR, adaptive_figure, layer_figure


def _run_dir(root, dataset, model, clip, morph, eps, seed):
    path = root / "results" / "seg" / dataset / model / clip / morph / f"eps{eps}" / f"seed{seed}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _metrics(root, dataset, model, clip, morph, eps, seed, dice, val=None):
    wc = dict(dataset=dataset, model=model, clip=clip, morph=morph, eps=eps, seed=str(seed))
    path = _run_dir(root, dataset, model, clip, morph, eps, seed) / "metrics.json"
    body = dict(wildcards=wc, dice=dice, hd95=5.0, mae=0.1, val_dice=dice if val is None else val)
    path.write_text(json.dumps(body | {"train_seconds": 1.0, "hd95_empty": 0}))
    return path


def _captured(monkeypatch):
    """Replace save_figure in seg_adaptive by a recorder of the figure."""
    figures = []
    monkeypatch.setattr(seg_adaptive, "save_figure", lambda fig, path: figures.append(fig))
    return figures


# --- Fig. 2 -------------------------------------------------------------------------------


@pytest.fixture
def sweep(tmp_path):
    m = _metrics
    return [
        m(tmp_path, "duke", "unet", "flat-C0.5-lr0.001", "none", "200", 0, 0.60),
        m(tmp_path, "duke", "unet", "flat-C0.5-lr0.001", "none", "200", 1, 0.70),
        m(tmp_path, "duke", "unet", "flat-C1-lr0.001", "none", "200", 0, 0.80),
        m(tmp_path, "duke", "unet", "flat-C0.5-lr1e-05", "none", "200", 0, 0.50),
        m(tmp_path, "duke", "unet", "flat-C0.5-lr1e-05", "none", "200", 1, 0.55),
        m(tmp_path, "duke", "unet", "flat-C1-lr0.0001", "none", "200", 0, 0.65),
        m(tmp_path, "umn", "unet", "flat-C1-lr0.0003", "none", "200", 0, 0.40),
        m(tmp_path, "duke", "unet", "flat", "none", "200", 0, 0.99),  # no sweep suffix
        m(tmp_path, "duke", "unet", "none", "none", "inf", 0, 0.95),
    ]


def test_lr_clip_cells_are_seed_means(sweep, tmp_path):
    cells = lr_clip_figure(sweep, tmp_path / "fig2.png")
    got = [
        (d, lr, c, round(v, 10), n)
        for d, lr, c, v, n in cells[["dataset", "lr", "C", "dice_mean", "n_seeds"]].itertuples(
            index=False
        )
    ]
    assert got == [  # datasets in study order, lr and C numerically ascending
        ("duke", 1e-05, 0.5, 0.525, 2),
        ("duke", 0.0001, 1.0, 0.65, 1),
        ("duke", 0.001, 0.5, 0.65, 2),
        ("duke", 0.001, 1.0, 0.8, 1),
        ("umn", 0.0003, 1.0, 0.4, 1),
    ]
    assert set(cells["rule"]) == {"flat"} and set(cells["model"]) == {"unet"}
    want = stats.t.interval(0.95, 1, loc=0.525, scale=stats.sem([0.50, 0.55]))
    assert (cells.loc[0, "dice_ci_low"], cells.loc[0, "dice_ci_high"]) == pytest.approx(want)
    assert math.isnan(cells.loc[1, "dice_ci_low"])  # one seed
    assert (tmp_path / "fig2.png").stat().st_size > 1000 and (tmp_path / "fig2.pdf").exists()


def test_lr_clip_figure_is_byte_identical_and_needs_sweep_runs(sweep, tmp_path):
    lr_clip_figure(sweep, tmp_path / "a.png")
    lr_clip_figure(sweep, tmp_path / "b.png")
    for ext in ("png", "pdf"):
        assert (tmp_path / f"a.{ext}").read_bytes() == (tmp_path / f"b.{ext}").read_bytes()
    with pytest.raises(ValueError, match="sweep"):
        lr_clip_figure(sweep[-2:], tmp_path / "c.png")


# --- Table 2 ------------------------------------------------------------------------------


@pytest.fixture
def quantile_runs(tmp_path):
    def m(clip, morph, eps, seed, val, model="unetpp", dataset="duke"):
        return _metrics(tmp_path, dataset, model, clip, morph, eps, seed, 0.5, val=val)

    return [
        m("flat", "adaptive-v1", "200", 0, 0.70),
        m("flat", "adaptive-v1", "200", 1, 0.72),
        m("flat", "adaptive-v1-q25-80", "200", 0, 0.69),
        m("flat", "adaptive-v1-q25-80", "200", 1, 0.70),
        m("flat", "adaptive-v1-q30-70", "200", 0, 0.73),
        m("none", "adaptive-v1", "inf", 0, 0.80),
        m("none", "adaptive-v1-q25-80", "inf", 0, 0.79),
        m("autos", "adaptive-v1-q25-80", "200", 0, 0.60),  # no (20, 85) run: empty cell
        m("flat", "adaptive-v2", "200", 0, 0.60),
        m("flat", "adaptive-v2-q25-80", "200", 0, 0.50),
        m("flat", "adaptive-v3-q20-85", "200", 0, 0.50),  # explicit (20, 85) = the baseline
        m("flat", "adaptive-v3-q25-80", "200", 0, 0.45),
        # ignored: per-image scope, swept clip, other model without variants, fixed, umn
        m("flat", "adaptive-v1-q25-80-s", "200", 0, 0.10),
        m("flat-C0.5-lr0.001", "adaptive-v1-q25-80", "200", 0, 0.10),
        m("flat", "adaptive-v1", "200", 0, 0.30, model="unet"),
        m("flat", "both-k3", "200", 0, 0.10),
        m("flat", "none", "200", 0, 0.10, dataset="umn"),
    ]


def test_quantile_table_deltas_equal_hand_computation(quantile_runs, tmp_path):
    table = quantile_table(quantile_runs, [20, 85])
    labels = ["AUTO-S", "Flat", "Non-private"]
    stats_of = ["", "_ci_low", "_ci_high", "_p_vs_base"]
    assert list(table.columns) == ["model", "policy", "setting"] + [
        label + suffix for label in labels for suffix in stats_of
    ]
    keys = list(table[["model", "policy", "setting"]].itertuples(index=False, name=None))
    assert keys == [
        ("UNet++", v, s) for v in ("v1", "v2", "v3") for s in ("Δ_{25,80}", "Δ_{30,70}")
    ]
    expected = {  # Dice_{20,85} − Dice_q, mean over the seeds both ran; None = missing
        ("v1", "Δ_{25,80}"): (None, 0.71 - 0.695, 0.80 - 0.79),
        ("v1", "Δ_{30,70}"): (None, 0.70 - 0.73, None),  # seed 0 only
        ("v2", "Δ_{25,80}"): (None, 0.60 - 0.50, None),
        ("v2", "Δ_{30,70}"): (None, None, None),
        ("v3", "Δ_{25,80}"): (None, 0.50 - 0.45, None),
        ("v3", "Δ_{30,70}"): (None, None, None),
    }
    for row in table.to_dict("records"):
        for label, want in zip(labels, expected[row["policy"], row["setting"]], strict=True):
            got = row[label]
            assert math.isnan(got) if want is None else got == pytest.approx(want)
    # v1 Δ_{25,80} on Flat: seeds 0 and 1 pair, differences 0.01 and 0.02
    first = table.iloc[0]
    want = stats.t.interval(0.95, 1, loc=0.015, scale=stats.sem([0.01, 0.02]))
    assert (first["Flat_ci_low"], first["Flat_ci_high"]) == pytest.approx(want)
    p = stats.ttest_rel([0.70, 0.72], [0.69, 0.70]).pvalue
    assert first["Flat_p_vs_base"] == pytest.approx(p)
    assert math.isnan(first["Non-private_ci_low"]) and math.isnan(first["Non-private_p_vs_base"])
    out = tmp_path / "table2.csv"
    write_table(table, out)
    first = list(csv.reader(out.read_text().splitlines()))[1]
    assert first[3] == "" and float(first[7]) == pytest.approx(0.015)  # missing cell is empty


def test_quantile_table_needs_variants(quantile_runs):
    with pytest.raises(ValueError, match="adaptive"):
        quantile_table([quantile_runs[0], quantile_runs[5]], [20, 85])


# --- Fig. 11 ------------------------------------------------------------------------------


@pytest.fixture
def adaptive_runs(tmp_path):
    def m(clip, morph, eps, seed, dice, val=None):
        return _metrics(tmp_path, "duke", "unetpp", clip, morph, eps, seed, dice, val=val)

    return [
        m("none", "none", "inf", 0, 0.80),
        m("none", "none", "inf", 1, 0.84),
        m("none", "adaptive-v1", "inf", 0, 0.85),
        m("flat", "none", "50", 0, 0.60),
        m("flat", "open-k3", "50", 0, 0.55, val=0.9),  # best on validation
        m("flat", "close-k5", "50", 0, 0.70, val=0.5),
        m("flat", "adaptive-v1", "50", 0, 0.62),
        m("flat", "adaptive-v2", "50", 0, 0.64),
        m("flat", "adaptive-v2", "50", 1, 0.66),
        m("flat", "adaptive-v3", "50", 0, 0.61),
        m("flat", "adaptive-v2-s", "50", 0, 0.63),
        m("flat", "adaptive-v2-q25-80", "50", 0, 0.10),  # Table 2 only
        m("flat-C1-lr0.001", "adaptive-v2", "50", 0, 0.10),  # Fig. 2 only
    ]


def test_adaptive_figure_bars_equal_hand_means(adaptive_runs, monkeypatch):
    figures = _captured(monkeypatch)
    adaptive_figure(adaptive_runs, "unused.png")
    (ax,) = figures[0].axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Non-private", "Flat"]
    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in containers}
    nan = float("nan")
    expected = {
        "no morph": [0.82, 0.60],
        "best fixed (val Dice)": [nan, 0.55],  # open-k3 (val 0.9), not close-k5 (test 0.70)
        "adaptive v1": [0.85, 0.62],
        "adaptive v2": [nan, 0.65],
        "adaptive v3": [nan, 0.61],
        "adaptive v2, per-image": [nan, 0.63],
    }
    assert list(bars) == list(expected)
    for label, heights in expected.items():
        assert bars[label] == pytest.approx(heights, nan_ok=True)
    assert [c.patches[0].get_hatch() for c in containers] == [None] * 5 + ["//"]
    assert "open-k3" in [t.get_text() for t in ax.texts]


def test_adaptive_figure_is_byte_identical_and_needs_adaptive_runs(adaptive_runs, tmp_path):
    adaptive_figure(adaptive_runs, tmp_path / "a.png")
    adaptive_figure(adaptive_runs, tmp_path / "b.png")
    for ext in ("png", "pdf"):
        assert (tmp_path / f"a.{ext}").read_bytes() == (tmp_path / f"b.{ext}").read_bytes()
    with pytest.raises(ValueError, match="adaptive"):
        adaptive_figure(adaptive_runs[:2] + adaptive_runs[-2:], tmp_path / "c.png")


# --- Fig. 12 ------------------------------------------------------------------------------


def _layer_run(root, model, clip, morph, eps, seed, epochs=2, shift=0.0):
    """diagnostics/history.csv and diagnostics/morph_log.csv of a run; layer c has val Dice
    0.1·c + shift and thickness c + epoch; operation: thin layers close, middle both, thick
    open (v1-style labels)."""
    run = _run_dir(root, "duke", model, clip, morph, eps, seed)
    (run / "diagnostics").mkdir()
    history = [
        {"epoch": e, "loss": 1.0 / e, "val_dice": 0.5, "epsilon": 1.0, "seconds": 0.1}
        | {f"val_dice_c{c}": 0.1 * c + shift - 0.05 * (epochs - e) for c in range(1, 9)}
        for e in range(1, epochs + 1)
    ]
    pd.DataFrame(history).to_csv(run / "diagnostics/history.csv", index=False)
    rows = []
    for e in range(1, epochs + 1):
        for c in range(1, 8):
            op = "close" if c <= 2 else ("both" if c <= 5 else "open")
            shares = {f"share_{o}": float(o == op) for o in ("open", "close", "both")}
            rows.append(
                {"epoch": e, "class": c, "thickness": c + e, "t_thin": 2.5, "t_thick": 6.5 + e}
                | shares
                | {"operation": op}
            )
    pd.DataFrame(rows, columns=MORPH_COLUMNS).to_csv(run / "diagnostics/morph_log.csv", index=False)
    return run


@pytest.fixture
def layer_runs(tmp_path):
    return [
        _layer_run(tmp_path, "unetpp", "flat", "adaptive-v2", "50", 1, shift=0.5),
        _layer_run(tmp_path, "unetpp", "flat", "adaptive-v2", "50", 0),
        _layer_run(tmp_path, "unetpp", "none", "adaptive-v2", "inf", 0, epochs=3, shift=0.05),
        _layer_run(tmp_path, "unet", "autos", "adaptive-v2", "50", 0),  # UNet++ preferred
        _layer_run(tmp_path, "unetpp", "autos", "adaptive-v1", "50", 0),  # not v2
    ]


def test_layer_figure_draws_the_logged_values(layer_runs, monkeypatch):
    figures = _captured(monkeypatch)
    layer_figure(layer_runs, "unused.png")
    axes = figures[0].axes
    assert [ax.get_title() for ax in axes[:2]] == ["Non-private (seed 0)", "Flat (seed 0)"]
    top_none, top_flat, bottom_none, bottom_flat = axes
    for ax, epochs in ((top_none, 3), (top_flat, 2)):
        lines = ax.get_lines()
        for c in range(1, 8):  # one line per layer: thickness c + epoch
            assert list(lines[c - 1].get_ydata()) == [c + e for e in range(1, epochs + 1)]
        assert list(lines[8].get_ydata()) == [6.5 + e for e in range(1, epochs + 1)]  # t_thick
    for ax, shift in ((bottom_none, 0.05), (bottom_flat, 0.0)):  # seed 0, last epoch
        heights = [p.get_height() for p in ax.patches]
        assert heights == pytest.approx([0.1 * c + shift for c in range(1, 8)])
        ops = ["close"] * 2 + ["both"] * 3 + ["open"] * 2
        colours = [mcolors.to_hex(p.get_facecolor()) for p in ax.patches]
        assert colours == [mcolors.to_hex(OPERATION_COLOR[op]) for op in ops]


def test_layer_figure_is_byte_identical_and_needs_v2_runs(layer_runs, tmp_path):
    layer_figure(layer_runs, tmp_path / "a.png")
    layer_figure(layer_runs, tmp_path / "b.png")
    for ext in ("png", "pdf"):
        assert (tmp_path / f"a.{ext}").read_bytes() == (tmp_path / f"b.{ext}").read_bytes()
    empty = _layer_run(tmp_path, "unetpp", "psac", "adaptive-v2", "50", 0, epochs=0)
    with pytest.raises(ValueError, match="adaptive-v2"):
        layer_figure([layer_runs[-1], empty], tmp_path / "c.png")
