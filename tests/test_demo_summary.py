"""The demo summary (dpmed.report.demo_summary) on tiny hand-made run files: which cells are the
learning ones, each target's verdict against a value computed by hand, and a grid without the
demo's cells (the paper config) getting `cells absent` rows instead of an error."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dpmed.report.demo_summary import (
    ABSENT,
    ATTACK_ROW,
    FLAT_ROW,
    MET,
    NOT_MET,
    SEG_DICE_ROW,
    XCAL_CHANCE_ROW,
    XCAL_REFERENCE_ROW,
    demo_summary,
    write_demo_summary,
)

SEG = "results/seg/duke/unet"
# (clip, morph, eps, seed, epochs, Dice, attack AUC or None)
DUKE = [
    ("none", "none", "inf", 0, 30, 0.80, 0.60),
    ("none", "none", "inf", 1, 30, 0.70, 0.58),
    ("flat", "none", "10", 0, 30, 0.40, 0.50),
    ("flat", "none", "200", 0, 30, 0.46, 0.54),  # 0.6 x 0.75 = 0.45: met
    ("flat-C2-lr0.01", "none", "50", 0, 2, 0.05, None),  # a short sweep cell: not a learning one
]


def _json(path: Path, obj: dict) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


def _seg(root: Path) -> dict[str, list[str]]:
    metrics, attacks = [], []
    for clip, morph, eps, seed, epochs, dice, auc in DUKE:
        run = root / SEG / clip / morph / f"eps{eps}" / f"seed{seed}"
        metrics.append(_json(run / "metrics.json", {"dice": dice, "epochs": epochs}))
        if auc is not None:
            attacks.append(_json(run / "attack.json", {"auc": auc}))
    # UNet++ trained shorter: Duke's learning model is the UNet
    unetpp = root / "results/seg/duke/unetpp/none/none/epsinf/seed0/metrics.json"
    metrics.append(_json(unetpp, {"dice": 0.1, "epochs": 2}))
    # COVID-19 CT: non-private below 0.7, no flat DP cell
    covid = root / "results/seg/covidct/infnet/none/none/epsinf/seed0/metrics.json"
    metrics.append(_json(covid, {"dice": 0.65, "epochs": 25}))
    return {"seg_metrics": metrics, "seg_attacks": attacks}


def _xcal(root: Path) -> dict[str, list[str]]:
    counts = [{"split": "test", "class_name": "all", "unit": "images", "count": 120}]
    meta = _json(root / "data/processed/bloodmnist/meta.json",
                 {"dataset": "bloodmnist", "n_classes": 8, "counts": counts})  # fmt: skip
    base = "results/xcal/bloodmnist/resnet18/{method}/iid/c3/eps{eps}/seed0/metrics.json"
    runs = []
    for method, eps, f1 in (("nondp", "inf", 0.55), ("static", "5", 0.13), ("xcal", "5", 0.12)):
        metrics = {"f1": f1, "road": 5.0, "road_random": 1.0,
                   "epsilon": None if eps == "inf" else 4.5}  # fmt: skip
        runs.append(_json(root / base.format(method=method, eps=eps), metrics))
    return {"xcal_metrics": runs, "xcal_meta": [meta]}


def _fets(root: Path) -> dict[str, list[str]]:
    path = root / "results/fets/fedavg/none/epsinf/seed0/rounds.csv"
    path.parent.mkdir(parents=True)
    rounds = {"round": [0, 1, 2], "dice_WT": [0.0, 0.1, 0.3], "dice_mean_labels": [0.1, 0.2, 0.25]}
    pd.DataFrame(rounds).to_csv(path, index=False)
    return {"fets_rounds": [str(path)]}


@pytest.fixture
def inputs(tmp_path, monkeypatch) -> dict[str, list[str]]:
    monkeypatch.chdir(tmp_path)
    return {**_seg(tmp_path), **_xcal(tmp_path), **_fets(tmp_path)}


def _result(targets: pd.DataFrame, target: str, cell: str) -> pd.Series:
    row = targets[(targets["target"] == target) & (targets["cell"] == cell)]
    assert len(row) == 1, (target, cell, targets)
    return row.iloc[0]


def test_targets_against_hand_computed_values(inputs):
    targets, _ = demo_summary(inputs)
    duke = _result(targets, SEG_DICE_ROW, "duke unet none none eps inf")
    assert (duke["seeds"], duke["measured"], duke["result"]) == (2, pytest.approx(0.75), MET)
    flat = _result(targets, FLAT_ROW, "duke unet flat none eps 200")  # the largest eps
    assert flat["threshold"] == pytest.approx(0.45) and flat["result"] == MET
    covid = _result(targets, SEG_DICE_ROW, "covidct infnet none none eps inf")
    assert covid["result"] == NOT_MET
    assert _result(targets, FLAT_ROW, "covidct infnet")["result"] == ABSENT
    attack = _result(targets, ATTACK_ROW, "duke unet")
    assert attack["measured"] == pytest.approx(0.59) and attack["threshold"] == pytest.approx(0.52)
    assert attack["result"] == MET
    reference = _result(targets, XCAL_REFERENCE_ROW, "bloodmnist resnet18 iid 3 nondp")
    # (1 + 1/8) / 2 = 0.5625 <= 0.55 fails; the note gives K and the test-set size
    assert reference["threshold"] == pytest.approx(0.5625) and reference["result"] == NOT_MET
    assert reference["note"] == "K = 8; 120 test images"
    static = _result(targets, XCAL_CHANCE_ROW, "bloodmnist resnet18 iid 3 static eps 5")
    xcal = _result(targets, XCAL_CHANCE_ROW, "bloodmnist resnet18 iid 3 xcal eps 5")
    assert (static["result"], xcal["result"]) == (MET, NOT_MET)  # 0.13 and 0.12 against 1/8


def test_summary_tables_hold_the_learning_cells_and_the_fets_gain(inputs, tmp_path):
    write_demo_summary(tmp_path / "summary.md", tmp_path / "tables/targets.csv", **inputs)
    text = (tmp_path / "summary.md").read_text()
    assert "| duke | unet | flat | none | 200 | 0 | 30 | 0.46 |" in text
    assert "flat-C2-lr0.01" not in text and "unetpp" not in text  # not learning cells
    assert "| fedavg | none | inf | 0 | 2 | 0 | 0.3 | 0.3 | 0.1 | 0.25 | 0.15 |" in text
    written = pd.read_csv(tmp_path / "tables/targets.csv")
    assert set(written["result"]) == {MET, NOT_MET, ABSENT}
    assert (tmp_path / "tables/targets.md").exists() and (tmp_path / "tables/targets.html").exists()


def test_a_grid_without_the_demo_cells_gets_absent_rows():
    targets, text = demo_summary({})
    assert set(targets["result"]) == {ABSENT}
    assert set(targets["target"]) == {SEG_DICE_ROW, ATTACK_ROW, XCAL_REFERENCE_ROW}
    assert text.count("Cells absent from this grid.") == 4
