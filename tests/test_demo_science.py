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
    assert non_private >= 0.7  # measured 0.81; an all-background prediction scores 0
    # measured 0.70 < 0.76 < 0.79: Dice rises with eps, below the non-private model at the
    # smallest eps and within 0.6x of it at the largest
    assert flat[10] < flat[50] < flat[200] and flat[10] < non_private
    assert flat[200] >= 0.6 * non_private


@pytest.mark.parametrize(
    ("cell", "private"),
    [("umn/lfunet/none/none/epsinf", "umn/lfunet/autos/none/eps50"),
     ("covidct/infnet/none/none/epsinf", "covidct/infnet/flat/none/eps50")],
)  # fmt: skip
def test_umn_and_covid_ct_learn_at_the_demo_size(smoke_run, cell, private):
    # measured non-private 0.86 (UMN LFUNet) and 0.78 (COVID-19 CT Inf-Net); DP at eps 50
    # 0.54 and 0.43. The margin below the 0.7 target absorbs other CPUs' arithmetic.
    runs = smoke_run / "results/seg"
    non_private = _metrics(runs / cell / "seed0")["dice"]
    assert non_private > 0.65
    assert 0.1 < _metrics(runs / private / "seed0")["dice"] < non_private


def test_fets_learns_over_rounds_without_and_with_server_dp(smoke_run):
    runs = smoke_run / "results/fets"

    def gain(run: str, column: str = "dice_mean_labels") -> float:
        dice = pd.read_csv(runs / run / "seed0/rounds.csv")[column]
        return float(dice.iloc[-1] - dice.iloc[0])

    # measured +0.28 and +0.15 over 3 rounds (mean Dice over the labels, round 0 = the
    # untrained model)
    assert gain("fedavg/none/epsinf") > 0.1 and gain("simagg/none/epsinf") > 0.1
    # the eps0 x collaborators sweep: with all 33 collaborators per round DP-FedAvg's
    # sensitivity 2C/m is 33x smaller, and sound DP-FedAvg at eps0 = 1e4 learns the whole tumour
    # (Dice WT measured 0.025 -> 0.235 in 3 rounds; the mean over labels counts the background
    # too)
    assert gain("dp_fedavg-rho1/sound/eps10000", "dice_WT") > 0.15


@pytest.mark.parametrize(
    ("dataset", "classes", "measured"),
    [("bloodmnist", 8, 0.64), ("pneumoniamnist", 2, 0.97), ("dermamnist", 7, 0.75)],
)  # fmt: skip
def test_xcal_non_dp_classifier_beats_chance(smoke_run, dataset, classes, measured):
    # The target is half-way from chance (1/K) to 1; the test asks for half of that gain, so
    # a model that stops learning fails while other CPUs' arithmetic does not.
    run = smoke_run / f"results/xcal/{dataset}/resnet18/nondp/iid/c3/epsinf/seed0"
    chance, target = 1 / classes, (1 + 1 / classes) / 2
    assert _metrics(run)["f1"] > (chance + target) / 2, f"measured {measured}"


def test_xcal_private_methods_beat_chance_below_non_dp(smoke_run):
    # BloodMNIST at eps 5, one seed: measured static 0.19, AGP 0.18, sound AGP 0.16, XCal-FL 0.15
    # against chance 0.125 and non-DP 0.64
    runs = smoke_run / "results/xcal/bloodmnist/resnet18"
    private = [_metrics(runs / f"{m}/iid/c3/eps5/seed0")["f1"]
               for m in ("static", "agp", "agp-dp", "xcal")]  # fmt: skip
    non_dp = _metrics(runs / "nondp/iid/c3/epsinf/seed0")["f1"]
    assert sum(private) / len(private) > 1 / 8
    assert max(private) < non_dp


def test_attack_scores_non_private_duke_unet_above_its_private_runs(smoke_run):
    # The attacked cells are the learning Duke UNet ones: AUC of both non-private seeds
    # (measured 0.57, 0.60) against the mean over the private ones (flat at eps 10/50/200 and
    # seed 1 at 50, the other clip rules at 50; measured 0.52-0.58, mean 0.55), on 104
    # evaluation images a side, so TPR at 1 % FPR is defined.
    runs = smoke_run / "results/seg/duke/unet"

    def attack(run: str) -> dict:
        return json.loads((runs / run / "attack.json").read_text())

    non_private = [attack(f"none/none/epsinf/seed{s}") for s in (0, 1)]
    private = [attack(f"flat/none/eps{e}/seed0") for e in (10, 50, 200)]
    private += [attack("flat/none/eps50/seed1")]
    private += [attack(f"{rule}/none/eps50/seed0") for rule in ("nsgd", "autos", "psac")]
    assert all(a["counts"]["n_evaluation"]["nonmembers"] >= 100 for a in non_private + private)
    assert min(a["auc"] for a in non_private) > 0.55

    def mean_auc(attacks: list[dict]) -> float:
        return sum(a["auc"] for a in attacks) / len(attacks)

    assert mean_auc(non_private) > mean_auc(private) + 0.02
