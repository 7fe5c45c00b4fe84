"""seg tables and figures from hand-made metrics.json files (means/stds computed by hand)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpmed.seg.report.main import (
    clipping_figure,
    collect_runs,
    main_table,
    setting_method,
    training_time_figure,
    write_main_table,
)


def _write(
    tmp_path,
    dataset,
    model,
    clip,
    morph,
    eps,
    seed,
    dice,
    hd95=5.0,
    mae=0.1,
    val=None,
    secs=10.0,
    **extra,
):
    wc = dict(dataset=dataset, model=model, clip=clip, morph=morph, eps=eps, seed=str(seed))
    path = tmp_path / "_".join(wc.values()) / "metrics.json"
    path.parent.mkdir(parents=True)
    body = dict(
        wildcards=wc,
        dice=dice,
        hd95=hd95,
        mae=mae,
        val_dice=dice if val is None else val,
        train_seconds=secs,
        hd95_empty=1,
        hd95_both_empty=2,
        **extra,
    )
    path.write_text(json.dumps(body))
    return path


@pytest.fixture
def runs(tmp_path):
    return [
        _write(tmp_path, "duke", "unet", "none", "none", "inf", 0, 0.80, hd95=8.0),
        _write(tmp_path, "duke", "unet", "none", "none", "inf", 1, 0.84, hd95=6.0),
        _write(tmp_path, "duke", "unet", "flat", "none", "200", 0, 0.70),
        _write(tmp_path, "duke", "unet", "flat", "both-k3", "200", 0, 0.72, val=0.5),
        _write(tmp_path, "duke", "unet", "flat", "open-k5", "200", 0, 0.60, val=0.9),
        _write(tmp_path, "duke", "unet", "autos", "adaptive-v2", "200", 0, 0.71, secs=20.0),
        _write(
            tmp_path, "covidct", "infnet", "psac", "none", "200", 0, 0.4, s_alpha=0.6, e_phi=0.7
        ),
    ]


def test_labels_follow_table_3():
    assert setting_method("none", "none") == ("Non-private", "No Morph")
    assert setting_method("none", "adaptive-v1") == ("Non-private", "Adaptive Morph (v1)")
    assert setting_method("autos", "none") == ("DP (no morph)", "AUTO-S")
    assert setting_method("flat", "both-k3") == ("DP + Morph", "Flat (both-k3)")
    assert setting_method("psac", "adaptive-v3") == ("DP + Adaptive Morph (v3)", "PSAC")


def test_main_table_means_and_t_intervals_over_seeds(runs):
    table = main_table(collect_runs(runs), "duke")
    assert len(table) == 5  # one row per (model, clip, morph, eps) cell
    first = table.iloc[0]
    assert (first["setting"], first["method"], first["n_seeds"]) == ("Non-private", "No Morph", 2)
    assert first["model"] == "UNet"
    assert first["dice_mean"] == pytest.approx(0.82)
    want = stats.t.interval(0.95, 1, loc=0.82, scale=stats.sem([0.80, 0.84]))
    assert (first["dice_ci_low"], first["dice_ci_high"]) == pytest.approx(want)
    half = stats.t.ppf(0.975, 1) * stats.sem([8.0, 6.0])
    assert first["HD95"] == f"7.0000 ± {half:.4f}"
    assert (first["hd95_empty"], first["hd95_both_empty"]) == (2, 4)  # summed over seeds
    assert math.isnan(table.iloc[1]["dice_ci_low"]) and table.iloc[1]["Dice"] == "0.7000 (n=1)"
    assert list(table["setting"]) == [
        "Non-private",
        "DP (no morph)",
        "DP + Morph",
        "DP + Morph",
        "DP + Adaptive Morph (v2)",
    ]
    assert "S_alpha" not in table.columns


def test_covid_table_has_structure_measures(runs, tmp_path):
    out = tmp_path / "tables" / "seg_main_covidct.csv"
    write_main_table(runs, "covidct", out)
    table = pd.read_csv(out)
    assert table.loc[0, "s_alpha_mean"] == pytest.approx(0.6)
    assert table.loc[0, "e_phi_mean"] == pytest.approx(0.7)
    assert out.with_suffix(".md").exists()


def test_figures_are_written(runs, tmp_path):
    clipping_figure(runs, "duke", tmp_path / "fig" / "seg_fig3_duke.png")
    training_time_figure(runs, tmp_path / "fig" / "seg_fig8_training_time.png")
    for name in ("seg_fig3_duke", "seg_fig8_training_time"):
        assert (tmp_path / "fig" / f"{name}.png").stat().st_size > 1000
        assert (tmp_path / "fig" / f"{name}.pdf").exists()


def test_figures_are_byte_identical_on_rerun(runs, tmp_path):
    clipping_figure(runs, "duke", tmp_path / "a.png")
    clipping_figure(runs, "duke", tmp_path / "b.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


def test_figure_morph_bar_is_the_fixed_variant_best_on_validation(runs):
    from dpmed.seg.report.main import _cell_means, best_fixed

    cells = _cell_means(collect_runs(runs))
    chosen = best_fixed(cells[(cells["model"] == "unet") & (cells["clip"] == "flat")])
    assert chosen["morph"] == "open-k5"  # val 0.9 beats both-k3's 0.5 despite lower test Dice


def test_clipping_figure_error_bars_are_95_percent_logit_t_intervals_over_seeds(tmp_path):
    from dpmed.seg.report.main import _cell_means

    dice = [0.70, 0.74, 0.71]  # the old bars were the sample sd (0.0208), not the interval
    paths = [_write(tmp_path, "duke", "unet", "flat", "none", "8", s, v) for s, v in
             enumerate(dice)]  # fmt: skip
    cell = _cell_means(collect_runs(paths)).iloc[0]
    z = np.log(np.array(dice) / (1 - np.array(dice)))  # Dice in [0, 1]: on the logit scale
    low, high = 1 / (1 + np.exp(-np.array(stats.t.interval(0.95, 2, z.mean(), stats.sem(z)))))
    assert cell["dice_below"] == pytest.approx(np.mean(dice) - low, rel=1e-9)
    assert cell["dice_above"] == pytest.approx(high - np.mean(dice), rel=1e-9)
    assert cell["hd95_below"] == pytest.approx(cell["hd95_above"])  # unbounded: symmetric


def test_main_table_tests_each_clip_rule_against_flat_paired_by_seed(tmp_path):
    dice = {"flat": [0.70, 0.74, 0.71], "psac": [0.72, 0.79, 0.75]}
    paths = [
        _write(tmp_path, "duke", "unet", clip, "none", "8", seed, value)
        for clip, values in dice.items()
        for seed, value in reversed(list(enumerate(values)))
    ]
    paths.append(_write(tmp_path, "duke", "unet", "autos", "none", "8", 0, 0.6))  # 1 pair
    table = main_table(collect_runs(paths), "duke").set_index("clip")
    want = stats.ttest_rel(dice["psac"], dice["flat"]).pvalue
    assert table.loc["psac", "dice_p_vs_flat"] == pytest.approx(want, rel=1e-12)
    assert math.isnan(table.loc["flat", "dice_p_vs_flat"])
    assert math.isnan(table.loc["autos", "dice_p_vs_flat"])


def test_one_seed_bars_have_no_error_bar_and_labels_clear_the_caps(tmp_path, monkeypatch):
    """A one-seed bar draws no interval (a zero-width cap would read as a precise value) and
    a morphology name starts above its bar's error bar."""
    from matplotlib.container import BarContainer

    import dpmed.seg.report.main as main

    paths = [_write(tmp_path, "duke", "unet", "flat", "none", "8", s, v, val=0.1)
             for s, v in enumerate([0.70, 0.74, 0.71])]  # fmt: skip
    paths += [_write(tmp_path, "duke", "unet", "flat", "both-k3", "8", s, v, val=0.9)
              for s, v in enumerate([0.60, 0.75, 0.66])]  # fmt: skip
    paths.append(_write(tmp_path, "duke", "unet", "none", "none", "inf", 0, 0.8))
    figures = []
    monkeypatch.setattr(main, "save_figure", lambda fig, path: figures.append(fig))
    clipping_figure(paths, "duke", tmp_path / "fig.png")
    ax = figures[0].axes[0]  # Dice of the UNet
    no_morph, morph = [c for c in ax.containers if isinstance(c, BarContainer)]
    caps = no_morph.errorbar.lines[2][0].get_segments()  # [non-private (1 seed), flat (3)]
    drawn = [bool(np.isfinite(np.asarray(segment)).any()) for segment in caps]
    assert drawn == [False, True]
    (label,) = [text for text in ax.texts if text.get_gid() != "seed-note"]
    notes = [text.get_text() for text in ax.texts if text.get_gid() == "seed-note"]
    assert notes == ["no interval: n = 1 seed per point (< 3)"]  # the non-private
    top = np.nanmax(np.asarray(morph.errorbar.lines[2][0].get_segments()[1])[:, 1])
    assert label.get_text() == "both-k3" and label.xy[1] >= top


def test_a_cell_that_did_not_learn_is_greyed_with_a_legend_entry(tmp_path, monkeypatch):
    """Dice 0.01 on an auto-scaled axis reads as an effect: the bar of a cell below the claims
    layer's learning floor is grey and hatched, unlike a learned one, and the legend says why."""
    from matplotlib.container import BarContainer

    import dpmed.seg.report.main as main
    from dpmed.seg.claims import LEARNED_DICE

    paths = [_write(tmp_path, "duke", "unet", "flat", "none", "8", s, v)
             for s, v in enumerate([0.01, 0.02, 0.015])]  # fmt: skip
    paths += [_write(tmp_path, "duke", "unet", "none", "none", "inf", s, v)
              for s, v in enumerate([0.80, 0.82, 0.81])]  # fmt: skip
    figures = []
    monkeypatch.setattr(main, "save_figure", lambda fig, path: figures.append(fig))
    clipping_figure(paths, "duke", tmp_path / "fig.png")
    ax = figures[0].axes[0]  # Dice of the UNet
    no_morph = [c for c in ax.containers if isinstance(c, BarContainer)][0]
    learned, unlearned = no_morph.patches  # [non-private, flat]
    assert unlearned.get_height() < LEARNED_DICE < learned.get_height()
    covers = [p for p in ax.patches if p.get_hatch() and p.get_width() > 0]
    assert [(c.get_xy(), c.get_width(), c.get_height()) for c in covers] == [
        (unlearned.get_xy(), unlearned.get_width(), unlearned.get_height())
    ]  # the unlearned bar alone is covered grey and hatched, the learned one drawn as is
    assert covers[0].get_facecolor() != learned.get_facecolor()
    assert covers[0].get_zorder() > unlearned.get_zorder()
    labels = ax.get_legend().get_texts()
    assert f"did not learn (Dice < {LEARNED_DICE:g})" in [t.get_text() for t in labels]
