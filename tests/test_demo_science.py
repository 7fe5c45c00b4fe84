"""The demo learns and its privacy costs show: orderings on the shared smoke run that break when
training, a privacy mechanism or the demo recipe (config/smoke.yaml, docs/demo.md) breaks."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow


def _metrics(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


def test_seg_non_private_learns_and_flat_dp_sgd_gains_with_eps(smoke_run):
    runs = smoke_run / "results/seg/duke/unet"
    non_private = _metrics(runs / "none/none/epsinf/seed0")["dice"]
    flat = {eps: _metrics(runs / f"flat/none/eps{eps}/seed0")["dice"] for eps in (10, 50, 200)}
    assert non_private >= 0.6  # measured 0.77; an all-background prediction scores 0
    assert non_private > flat[10]  # measured 0.20 at eps 10
    # measured 0.20 < 0.67 (eps 50) and 0.53 (eps 200): one seed per cell, so the two larger eps
    # are within seed noise of each other (flat at eps 50 scores 0.50 with seed 1)
    assert flat[10] < min(flat[50], flat[200])


def test_fets_learns_over_rounds_without_and_with_server_dp(smoke_run):
    runs = smoke_run / "results/fets"

    def gain(run: str, column: str = "dice_mean_labels") -> float:
        dice = pd.read_csv(runs / run / "seed0/rounds.csv")[column]
        return float(dice.iloc[-1] - dice.iloc[0])

    # measured +0.25 and +0.19 (mean Dice over the labels, round 0 = the untrained model)
    assert gain("fedavg/none/epsinf") > 0.1 and gain("simagg/none/epsinf") > 0.1
    # the eps0 x collaborators sweep: with all 33 collaborators per round DP-FedAvg's
    # sensitivity 2C/m is 33x smaller, and sound DP-FedAvg at eps0 = 1e4 learns the whole tumour
    # (Dice WT measured 0.02 -> 0.67; the mean over labels counts the background too)
    assert gain("dp_fedavg-rho1/sound/eps10000", "dice_WT") > 0.3


def test_xcal_non_dp_classifier_beats_chance(smoke_run):
    # macro F1 of a uniform random guess is about 1/K = 0.125 for the 8 blood-cell classes;
    # measured 0.36 (federated, 3 clients, 2 of them per round)
    run = smoke_run / "results/xcal/bloodmnist/resnet18/nondp/iid/c3/epsinf/seed0"
    assert _metrics(run)["f1"] > 0.2


def test_attack_scores_non_private_duke_unet_above_its_private_runs(smoke_run):
    # The learning Duke UNet cells: the global-loss attack's AUC on both non-private seeds
    # (measured 0.69, 0.66) against the mean over the private ones (flat at eps 10/50/200, the
    # other clip rules at eps 50; measured 0.53-0.65, mean 0.61). With 24 evaluation images a
    # side no single gap is significant (docs/demo.md), so the test compares the means.
    runs = smoke_run / "results/seg/duke/unet"

    def auc(run: str) -> float:
        return json.loads((runs / run / "attack.json").read_text())["auc"]

    non_private = [auc(f"none/none/epsinf/seed{s}") for s in (0, 1)]
    private = [auc(f"flat/none/eps{e}/seed0") for e in (10, 50, 200)] + [
        auc("flat/none/eps50/seed1")
    ]
    private += [auc(f"{rule}/none/eps50/seed0") for rule in ("nsgd", "autos", "psac")]
    assert min(non_private) > 0.6
    assert sum(non_private) / len(non_private) > sum(private) / len(private)
