"""Global-loss membership attack (paper 002 Fig. 9): metrics against hand computations and the
Mann–Whitney statistic, run_attack on a tiny trained run, the Fig. 9 report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SEG_PARAMS
from scipy import stats
from scipy.stats import mannwhitneyu
from test_seg_train import job, train

from dpmed.io import write_json, write_npz
from dpmed.metrics import membership as mi
from dpmed.models import build_model, load_model, save_model
from dpmed.report.intervals import bootstrap_interval, seed_bootstrap_interval
from dpmed.seg.attack import run_attack
from dpmed.seg.data import load_seg_data
from dpmed.seg.evaluate import morph_output
from dpmed.seg.losses import per_sample_loss
from dpmed.seg.morphology import parse_morph
from dpmed.seg.report.attack import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    attack_report,
    attack_table,
    collect_attacks,
)

# Hand-made example (scores = −loss). Members M = [4, 3, 3, 1], non-members N = [3, 2, 0, 0].
M, N = [4.0, 3.0, 3.0, 1.0], [3.0, 2.0, 0.0, 0.0]
# Calibration split: members [5, 2], non-members [3, 1].
M_CAL, N_CAL = [5.0, 2.0], [3.0, 1.0]


def test_auc_by_hand():
    # pairs (m, n) with m > n count 1, ties ½: m=4 beats all 4 → 4; each m=3 beats 2, 0, 0 and
    # ties 3 → 3.5; m=1 beats 0, 0 → 2; (4 + 3.5 + 3.5 + 2)/16 = 13/16.
    assert mi.auc(M, N) == 13 / 16


def test_roc_by_hand():
    # τ = +∞, 4, 3, 2, 1, 0 with rule s ≥ τ: TP = 0, 1, 3, 3, 4, 4 of 4; FP = 0, 0, 1, 2, 2, 4 of 4
    thresholds, tpr, fpr = mi.roc(M, N)
    assert thresholds.tolist() == [math.inf, 4, 3, 2, 1, 0]
    assert tpr.tolist() == [0, 0.25, 0.75, 0.75, 1, 1]
    assert fpr.tolist() == [0, 0, 0.25, 0.5, 0.5, 1]
    # trapezoid area of that curve = 0.125 + 0.1875 + 0 + 0.5 = 13/16, the Mann–Whitney AUC
    assert np.trapezoid(tpr, fpr) == 13 / 16


def test_advantage_and_tpr_at_low_fpr_by_hand():
    # TPR − FPR over the ROC above: 0, .25, .5, .25, .5, 0 → 0.5
    assert mi.advantage(M, N) == 0.5
    # 4 non-members < 1/0.01: only FPR = 0 qualifies; the only member above every non-member
    # (max 3) is the 4 → TPR 1/4, for both targets
    assert mi.tpr_at_fpr(M, N, 0.01) == 0.25
    assert mi.tpr_at_fpr(M, N, 0.001) == 0.25


def test_tpr_at_fpr_allows_exactly_one_in_a_hundred():
    # non-members 0..99; members 99.5, 98.5, 50. τ = 98.5: FP = 1 (the 99) = 1 % → TP = 2;
    # τ = 98 would give FP = 2. At 0.1 % no false positive: τ = 99.5 → TP = 1.
    members, nonmembers = [99.5, 98.5, 50.0], np.arange(100.0)
    assert mi.tpr_at_fpr(members, nonmembers, 0.01) == 2 / 3
    assert mi.tpr_at_fpr(members, nonmembers, 0.001) == 1 / 3


def test_threshold_and_balanced_accuracy_by_hand():
    # calibration candidates 5, 3, 2, 1: balanced accuracy (TPR + 1 − FPR)/2 =
    # (.5 + 1)/2 = .75, (.5 + .5)/2 = .5, (1 + .5)/2 = .75, (1 + 0)/2 = .5. Tie between τ = 5
    # and τ = 2 → the larger, 5, then the midpoint with the next lower score 3 → τ = 4.
    assert mi.choose_threshold(M_CAL, N_CAL) == 4.0
    # evaluation at τ = 4: TPR = 1/4 (only the 4), TNR = 4/4 → (0.25 + 1)/2
    assert mi.balanced_accuracy(M, N, 4.0) == 0.625
    result = mi.attack_metrics((M_CAL, N_CAL), (M, N))
    assert result == {
        "auc": 13 / 16,
        "threshold": 4.0,
        "balanced_accuracy": 0.625,
        "advantage": 0.5,
        "tpr_at_fpr_1pct": 0.25,
        "tpr_at_fpr_0.1pct": 0.25,
    }


def test_perfectly_separable_losses():
    rng = np.random.default_rng(0)
    member_loss, nonmember_loss = rng.uniform(0, 1, 50), rng.uniform(2, 3, 60)
    cal = (-member_loss[:25], -nonmember_loss[:30])
    ev = (-member_loss[25:], -nonmember_loss[30:])
    result = mi.attack_metrics(cal, ev)
    assert result["auc"] == 1.0
    assert result["balanced_accuracy"] == 1.0 and result["advantage"] == 1.0
    assert result["tpr_at_fpr_1pct"] == 1.0 and result["tpr_at_fpr_0.1pct"] == 1.0
    assert -2 < result["threshold"] < -1  # between the two groups (max margin)


def test_identical_distributions_give_chance():
    n = 2000
    rng = np.random.default_rng(1)
    losses = rng.gamma(2.0, 1.0, size=(2, n))
    # null sd of the Mann–Whitney AUC with n₁ = n₀ = n: sqrt((n₁ + n₀ + 1)/(12 n₁ n₀)) ≈ 0.0091
    sd = math.sqrt((2 * n + 1) / (12 * n * n))
    assert abs(mi.auc(-losses[0], -losses[1]) - 0.5) < 3 * sd
    result = mi.attack_metrics(
        (-losses[0, :1000], -losses[1, :1000]), (-losses[0, 1000:], -losses[1, 1000:])
    )
    assert abs(result["balanced_accuracy"] - 0.5) < 0.05


def test_auc_matches_mann_whitney_u_with_ties():
    rng = np.random.default_rng(2)
    m, n = np.round(rng.normal(0.3, 1, 70), 1), np.round(rng.normal(0, 1, 90), 1)  # many ties
    u = mannwhitneyu(m, n, alternative="two-sided").statistic  # U of the first sample
    assert mi.auc(m, n) == pytest.approx(u / (70 * 90), abs=1e-12)
    _, tpr, fpr = mi.roc(m, n)
    assert mi.auc(m, n) == pytest.approx(np.trapezoid(tpr, fpr), abs=1e-12)


def test_metrics_reject_empty_or_nan():
    with pytest.raises(ValueError, match="no member"):
        mi.auc([], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        mi.roc([1.0], [math.nan])


HP = SEG_PARAMS | {"epochs": 2, "batch_size": 4, "lr": 0.01, "width": 4, "depth": 2}
COUNTS = {"train": 12, "val": 3, "test": 4}  # non-members 7 < members 12


def _processed(folder, n_classes: int) -> str:
    """Tiny processed dataset: 16×16 images, a bright square labelled by class."""
    rng = np.random.default_rng(0)
    for split, count in COUNTS.items():
        images = rng.uniform(0, 0.2, (count, 16, 16)).astype(np.float32)
        masks = np.zeros((count, 16, 16), np.uint8)
        for i in range(count):
            r, c = rng.integers(0, 10, 2)
            images[i, r : r + 6, c : c + 6] += 0.7
            masks[i, r : r + 6, c : c + 6] = 1 + i % (n_classes - 1)
        write_npz(folder / f"{split}.npz", images=images, masks=masks)
    write_json(folder / "meta.json", {"classes": {str(k): f"c{k}" for k in range(n_classes)}})
    return str(folder)


def _independent_losses(run_dir, processed, dataset, morph, batch):
    """Per-image losses of the held-out images, recomputed here from the saved model."""
    data = load_seg_data(processed, dataset)
    net = load_model(Path(run_dir) / "model.pt")
    spec = parse_morph(morph, (20.0, 85.0))
    losses = []
    with torch.no_grad():
        for name in ("val", "test"):
            split = data.splits[name]
            for start in range(0, len(split), batch):
                out, _ = morph_output(spec, net(split.images[start : start + batch]))
                losses += per_sample_loss(out, split.masks[start : start + batch]).tolist()
    return np.array(losses)


def test_run_attack_on_a_tiny_trained_run(tmp_path):
    processed = _processed(tmp_path / "processed", 2)
    wc = dict(dataset="umn", model="unet", clip="none", morph="open-k3", eps="inf", seed="0")
    run = tmp_path / "run"
    train(processed, run, wc, HP, 3)
    result = run_attack(job(processed, run, wc, HP, 3))
    first = (run / "attack.json").read_bytes()
    assert json.loads(first) == result
    keys = {"auc", "balanced_accuracy", "threshold", "advantage", "tpr_at_fpr_1pct"}
    assert keys | {"tpr_at_fpr_0.1pct", "counts", "score", "wildcards", "seed"} <= set(result)
    # balanced: 7 non-members (val + test) → 7 of the 12 members; calibration round(3.5) = 4
    assert result["counts"] == {
        "n_members_available": 12,
        "n_nonmembers_available": 7,
        "n_members": 7,
        "n_nonmembers": 7,
        "n_calibration": {"members": 4, "nonmembers": 4},
        "n_evaluation": {"members": 3, "nonmembers": 3},
    }
    assert result["wildcards"] == wc and result["seed"] == 3
    scores = result["evaluation_scores"]  # per image, for the report's bootstrap
    assert len(scores["members"]) == len(scores["nonmembers"]) == 3
    assert mi.auc(scores["members"], scores["nonmembers"]) == result["auc"]
    for key in keys - {"threshold"}:
        assert 0 <= result[key] <= 1
    # every held-out image is used, so their mean loss is that of an independent recomputation
    expected = _independent_losses(run, processed, "umn", "open-k3", 7).mean()
    assert result["mean_loss"]["nonmembers"] == pytest.approx(expected, rel=1e-5)
    run_attack(job(processed, run, wc, HP, 3))
    assert (run / "attack.json").read_bytes() == first  # deterministic


def test_adaptive_batch_scope_is_scored_image_by_image(tmp_path):
    processed = _processed(tmp_path / "processed", 9)
    run = tmp_path / "run"
    # an untrained net whose batch thresholds pick other operations than the per-image ones by
    # a wide margin (seed 0's differed from them only on some CPUs: equal here to the bit)
    torch.manual_seed(1)
    arguments = {"in_channels": 1, "n_classes": 9, "width": 4, "depth": 2}
    net = build_model("unet", **arguments)
    run.mkdir()
    save_model(run / "model.pt", "unet", arguments, net)
    wc = dict(dataset="duke", model="unet", clip="flat", morph="adaptive-v1", eps="50", seed="0")
    result = run_attack(job(processed, run, wc, HP, 0))
    assert result["scoring_batch_size"] == 1
    expected = _independent_losses(run, processed, "duke", "adaptive-v1", 1).mean()
    assert result["mean_loss"]["nonmembers"] == pytest.approx(expected, rel=1e-6)
    # scored in one batch of 7 the losses differ (batch thresholds couple the images)
    assert _independent_losses(run, processed, "duke", "adaptive-v1", 7).mean() != expected


def _attack_json(path, wc, auc, ba, scores=((-1.0, -2.0), (-1.5, -3.0))):
    metrics = {"auc": auc, "balanced_accuracy": ba, "advantage": 2 * ba - 1}
    metrics |= {"tpr_at_fpr_1pct": 0.1, "tpr_at_fpr_0.1pct": 0.0, "threshold": -1.0}
    metrics["evaluation_scores"] = {"members": list(scores[0]), "nonmembers": list(scores[1])}
    write_json(path / "attack.json", metrics | {"wildcards": wc})
    return str(path / "attack.json")


def test_attack_report_table_and_figure(tmp_path):
    base = dict(dataset="duke", model="unet", morph="none")
    cells = [
        (dict(clip="none", eps="inf", seed="0"), 0.80, 0.75),
        (dict(clip="none", eps="inf", seed="1"), 0.70, 0.65),
        (dict(clip="flat", eps="50", seed="0"), 0.52, 0.50),
        (dict(clip="flat-C0.5-lr0.001", eps="50", seed="0"), 0.6, 0.55),  # sweep: table only
        (dict(clip="autos", eps="50", seed="0", morph="adaptive-v2"), 0.5, 0.5),  # table only
        (dict(clip="psac", eps="50", seed="0", dataset="umn"), 0.61, 0.58),
    ]
    paths = []
    for i, (wc, auc, ba) in enumerate(cells):
        (tmp_path / str(i)).mkdir()
        paths.append(_attack_json(tmp_path / str(i), base | wc, auc, ba))
    png, csv = tmp_path / "fig9.png", tmp_path / "fig9.csv"
    table = attack_report(paths, png, csv)
    for path in (png, png.with_suffix(".pdf"), csv, csv.with_suffix(".md")):
        assert path.stat().st_size > 0
    assert list(zip(table["dataset"], table["clip"], table["morph"], strict=True)) == [
        ("duke", "none", "none"),
        ("duke", "flat", "none"),
        ("duke", "flat-C0.5-lr0.001", "none"),
        ("duke", "autos", "adaptive-v2"),
        ("umn", "psac", "none"),
    ]
    first = table.iloc[0]
    assert first["n_seeds"] == 2 and first["auc_mean"] == pytest.approx(0.75)
    assert first["balanced_accuracy_mean"] == pytest.approx(0.70)
    want = stats.t.interval(0.95, 1, loc=0.70, scale=stats.sem([0.75, 0.65]))
    assert (first["balanced_accuracy_ci_low"], first["balanced_accuracy_ci_high"]) == (
        pytest.approx(want)
    )
    assert math.isnan(table.iloc[1]["auc_ci_low"])  # one seed: no t-interval
    before = png.read_bytes()
    attack_report(paths, png, csv)
    assert png.read_bytes() == before


def test_attack_figure_intervals_stay_in_range_and_two_seeds_draw_none(tmp_path, monkeypatch):
    """Balanced accuracy is in [0, 1]: its error bar stays there (the two-seed t-interval of
    0.45 and 1.0 ran from -3.1 to 4.2); fewer seeds than a claim needs draw no interval and
    the count is written on the figure."""
    import dpmed.seg.report.attack as attack

    base = dict(dataset="duke", model="unet", morph="none")
    cells = [(dict(clip="none", eps="inf"), [0.45, 1.0]),
             (dict(clip="flat", eps="50"), [0.5, 0.98, 1.0])]  # fmt: skip
    paths = []
    for wc, values in cells:
        for seed, ba in enumerate(values):
            folder = tmp_path / f"{wc['clip']}{seed}"
            folder.mkdir()
            paths.append(_attack_json(folder, base | wc | {"seed": str(seed)}, 0.6, ba))
    figures = []
    monkeypatch.setattr(attack, "save_figure", lambda fig, path: figures.append(fig))
    attack.attack_report(paths, tmp_path / "f.png", tmp_path / "f.csv")
    (ax,) = figures[0].axes
    segments = [
        np.asarray(segment, float).reshape(-1, 2)
        for bars in ax.containers
        if getattr(bars, "errorbar", None)
        for segment in bars.errorbar.lines[2][0].get_segments()
    ]
    drawn = [s for s in segments if s.size and np.isfinite(s).all()]
    assert len(drawn) == 1  # flat's three seeds; the non-private two: none
    assert 0.0 <= drawn[0][:, 1].min() and drawn[0][:, 1].max() <= 1.0
    assert [t.get_text() for t in ax.texts] == ["no interval: n = 2 seeds per point (< 3)"]


def test_attack_report_rejects_empty_input(tmp_path):
    with pytest.raises(ValueError, match="no attack.json"):
        attack_report([], tmp_path / "a.png", tmp_path / "a.csv")
    only_sweep = _attack_json(
        tmp_path,
        dict(dataset="duke", model="unet", morph="none", clip="flat-C1-lr0.01", eps="50", seed="0"),
        0.5,
        0.5,
    )
    with pytest.raises(ValueError, match="no attack results of paper cells"):
        attack_report([only_sweep], tmp_path / "b.png", tmp_path / "b.csv")


def test_attack_table_bootstraps_images_and_pairs_seeds_against_flat(tmp_path):
    """Bootstrap columns: the members/non-members of each seed resampled separately, the
    statistic averaged over seeds (`bootstrap_interval`, itself tested against scipy); the
    two-stage columns over seeds then images (`seed_bootstrap_interval`); a
    perfect separation in every resample gives [1, 1]. p_vs_flat: scipy's paired t-test."""
    base = dict(dataset="duke", model="unet", morph="none", eps="50")
    rng = np.random.default_rng(4)
    runs, paths = [], []
    for i, (clip, seed, auc) in enumerate(
        [("flat", 0, 0.50), ("flat", 1, 0.55), ("flat", 2, 0.52),
         ("psac", 2, 0.60), ("psac", 0, 0.58), ("psac", 1, 0.70)]
    ):  # fmt: skip
        scores = (rng.normal(0.3, 1, 6), rng.normal(0, 1, 5))
        if clip == "psac" and seed == 0:
            scores = (np.array([5.0, 6.0]), np.array([1.0, 2.0, 3.0]))
        (tmp_path / str(i)).mkdir()
        wc = base | dict(clip=clip, seed=str(seed))
        paths.append(_attack_json(tmp_path / str(i), wc, auc, 0.5, scores))
        runs.append((clip, seed, auc, scores))
    table = attack_table(collect_attacks(paths)).set_index("clip")
    for clip in ("flat", "psac"):
        cell = [r[3] for r in runs if r[0] == clip]
        want = bootstrap_interval(cell, mi.auc, BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED)
        got = table.loc[clip, ["auc_boot_low", "auc_boot_high"]]
        assert tuple(got) == pytest.approx(want)
        assert table.loc[clip, "auc_boot_low"] <= table.loc[clip, "auc_boot_high"]
        want = seed_bootstrap_interval(cell, mi.auc, BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED)
        got = table.loc[clip, ["auc_seedboot_low", "auc_seedboot_high"]]
        assert tuple(got) == pytest.approx(want)
    perfect = [r[3] for r in runs if r[0] == "psac" and r[1] == 0]
    assert bootstrap_interval(perfect, mi.auc) == (1.0, 1.0)
    want = stats.ttest_rel([0.58, 0.70, 0.60], [0.50, 0.55, 0.52]).pvalue  # seeds 0, 1, 2
    assert table.loc["psac", "auc_p_vs_flat"] == pytest.approx(want)
    assert math.isnan(table.loc["flat", "auc_p_vs_flat"])
    assert table.loc["psac", "n_seeds"] == 3


def test_an_attack_json_without_per_image_scores_names_the_file_and_the_fix(tmp_path):
    from dpmed.errors import DataFormatError
    from dpmed.seg.report.attack import collect_attacks

    old = tmp_path / "attack.json"
    old.write_text('{"wildcards": {}, "auc": 0.5}')
    with pytest.raises(DataFormatError, match="attack.json.*rerun this attack"):
        collect_attacks([old])
