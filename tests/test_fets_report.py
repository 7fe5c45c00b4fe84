"""fets report (paper 000): Fig. 2, the four modalities of one slice with the BraTS labels;
Fig. 4 over seeds; Table II pooled over seeds with intervals and paired tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpmed.data import fets
from dpmed.data.synthetic import fets as synthetic_fets
from dpmed.fets.brats import DICE_KEYS
from dpmed.fets.outputs import REPORTS
from dpmed.fets.report import figure2, table2


@pytest.fixture(scope="module")
def processed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fets_fig2")
    cfg = {"raw": "synthetic", "partitioning": "partitioning_2.csv", "val_fraction": 0.2,
           "split_seed": 0, "synthetic": {"shape": [24, 24, 16], "subjects_scale": 0.03,
                                          "seed": 0}}  # fmt: skip
    synthetic_fets.generate(root / "raw", "fets", cfg, seed=0)
    fets.preprocess(root / "raw", root / "processed", "fets", cfg)
    return root / "processed"


def test_tumour_slice_has_all_four_modalities_and_the_labels(processed):
    view = fets.tumour_slice(processed)
    _, label = fets.load_subject(processed, view.subject)
    assert view.z == int(np.argmax(np.count_nonzero(label, axis=(0, 1))))
    np.testing.assert_array_equal(view.label, np.rot90(label[:, :, view.z]))
    assert view.images.shape == (len(fets.MODALITIES), *view.label.shape)
    assert view.images.dtype == np.float32 and view.images.min() >= 0
    assert np.allclose(view.images.max(axis=(1, 2)), 1.0)  # each rescaled on its own
    assert not any(np.array_equal(view.images[0], other) for other in view.images[1:])
    (panel,) = fets.overview_panels(processed)  # the data overview shows its FLAIR
    np.testing.assert_array_equal(panel.image, view.images[fets.MODALITIES.index("flair")])


def test_figure2_is_registered_and_byte_identical_on_reruns(processed, tmp_path):
    entry = REPORTS["fets_figure2"]
    assert entry.targets([object()]) == ["results/figures/fets_fig2_modalities.png"]
    assert entry.files["png_path"][1] == "fets_fig2" and entry.subcategory == "Fig. 2"
    assert entry.inputs([])["_processed"] == ["data/processed/fets/splits.csv",
                                              "data/processed/fets/meta.json"]  # fmt: skip
    for name in ("a", "b"):
        figure2(processed, tmp_path / name / "fig2.png")
    for ext in (".png", ".pdf"):
        first, second = (tmp_path / n / f"fig2{ext}" for n in ("a", "b"))
        assert first.stat().st_size > 1000 and first.read_bytes() == second.read_bytes()


def test_figure4_draws_each_method_once_as_the_mean_over_its_seeds(tmp_path, monkeypatch):
    from dpmed.fets import report

    panels = ("dice_WT", "dice_TC", "dice_ET", "dice_mean_labels", "convergence_score")
    runs = []
    for seed, level in ((0, 0.2), (1, 0.4), (2, 0.6)):
        run = tmp_path / "results/fets/simagg/none/epsinf" / f"seed{seed}"
        run.mkdir(parents=True)
        rounds = {"round": [0, 1, 2], **{c: [level, level + 0.1, level + 0.2] for c in panels}}
        pd.DataFrame(rounds).to_csv(run / "rounds.csv", index=False)
        runs.append(run)
    shown = {}
    monkeypatch.setattr(report, "save_figure", lambda fig, path: shown.setdefault("fig", fig))
    report.figure4(runs, tmp_path / "fig4.png")
    ax = shown["fig"].axes[0]
    (line,) = ax.get_lines()  # one line for the three seeds of SimAgg
    assert np.allclose(line.get_ydata(), [0.4, 0.5, 0.6])  # the mean over seeds
    (band,) = ax.collections  # its 95 % t-interval on the logit scale, back-transformed

    def logit_interval(values):
        z = np.log(np.array(values) / (1 - np.array(values)))
        half = 4.302653 * z.std(ddof=1) / np.sqrt(3)
        return 1 / (1 + np.exp(-(z.mean() - half))), 1 / (1 + np.exp(-(z.mean() + half)))

    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.max() == pytest.approx(logit_interval([0.4, 0.6, 0.8])[1], rel=1e-5)
    assert ys.min() == pytest.approx(logit_interval([0.2, 0.4, 0.6])[0], rel=1e-5)
    assert 0 < ys.min() and ys.max() < 1  # the plain t-interval ran to 1.1


def _table2_run(root, aggregator, dpmode, eps, seed, dice, eps_rdp=np.nan):
    """A fets run folder with the metrics.json and privacy.json Table II reads."""
    run = root / f"results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}"
    run.mkdir(parents=True)
    metrics = {"sim_time_s": 600.0, "convergence_score": dice / 2, "dice_WT_round0": 0.1}
    metrics |= {k: dice for k in DICE_KEYS}
    private = dpmode != "none"
    privacy = {
        "epsilon_by_accountant": {"rdp": eps_rdp} if private else {},
        "delta": 1e-5 if private else None,
        "guarantee": "dp" if private else "none",
    }
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "privacy.json").write_text(json.dumps(privacy))
    return run


def test_table2_pools_seeds_with_t_intervals_and_paired_tests(tmp_path):
    dice = {("simagg", "none"): [0.60, 0.66, 0.70], ("fedavg", "none"): [0.55, 0.57, 0.66],
            ("dp_simagg", "sound"): [0.20, 0.22, 0.21], ("dp_simagg", "paper"): [0.10, 0.15, 0.12],
            ("dp_fedavg", "sound"): [0.18, 0.30, 0.19]}  # fmt: skip
    runs = []
    for (aggregator, dpmode), values in dice.items():
        eps = "inf" if dpmode == "none" else "1"
        for seed, value in enumerate(values):
            runs.append(_table2_run(tmp_path, aggregator, dpmode, eps, seed, value, 1.0 + seed))
    table = table2(runs[::-1], tmp_path / "table2.csv")
    methods = [
        "DP-SimAgg paper eps0=1",
        "SimAgg",
        "DP-SimAgg sound eps0=1",
        "FedAvg",
        "DP-FedAvg eps0=1",
    ]  # fmt: skip (the registered order)
    assert table["method"].tolist() == methods
    table = table.set_index(["aggregator", "dpmode"])
    row = table.loc[("simagg", "none")]
    x = dice[("simagg", "none")]
    want = stats.t.interval(0.95, 2, loc=np.mean(x), scale=stats.sem(x))
    assert row["n_seeds"] == 3 and row["dice_WT_mean"] == pytest.approx(np.mean(x))
    assert (row["dice_WT_ci_low"], row["dice_WT_ci_high"]) == pytest.approx(want)
    p = stats.ttest_rel(x, dice[("fedavg", "none")]).pvalue
    assert row["dice_WT_p_vs_fedavg"] == pytest.approx(p, rel=1e-12)
    sound = table.loc[("dp_simagg", "sound")]
    p = stats.ttest_rel(dice[("dp_simagg", "sound")], dice[("dp_fedavg", "sound")]).pvalue
    assert sound["dice_ET_p_vs_fedavg"] == pytest.approx(p, rel=1e-12)
    p = stats.ttest_rel(dice[("dp_simagg", "sound")], dice[("dp_simagg", "paper")]).pvalue
    assert sound["convergence_score_p_vs_paper"] == pytest.approx(p, rel=1e-12)
    assert sound["eps_total_rdp"] == 3.0 and sound["guarantee"] == "dp"  # largest over seeds
    assert np.isnan(table.loc[("fedavg", "none"), "dice_WT_p_vs_fedavg"])
    assert np.isnan(table.loc[("simagg", "none"), "dice_WT_p_vs_paper"])
