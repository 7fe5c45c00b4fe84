"""The fets part of the smoke DAG: run once, then check its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO

pytestmark = pytest.mark.slow

RUNS = [
    ("fedavg", "none", "inf"), ("simagg", "none", "inf"),
    ("dp_simagg", "paper", "1"), ("dp_simagg", "paper", "10"),
    ("dp_simagg", "sound", "1"), ("dp_simagg", "sound", "10"),
    ("dp_fedavg", "sound", "1"), ("dp_fedavg", "sound", "10"),
]  # fmt: skip
SMOKE = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())["fets"]["defaults"]


@pytest.fixture(scope="module")
def smoke(smoke_run: Path) -> Path:
    """The shared smoke run (its fets part)."""
    return smoke_run


def _run(workdir: Path, aggregator: str, dpmode: str, eps: str) -> Path:
    return workdir / f"results/fets/{aggregator}/{dpmode}/eps{eps}/seed0"


def test_every_run_wrote_its_files(smoke):
    for run in RUNS:
        folder = _run(smoke, *run)
        rounds = pd.read_csv(folder / "rounds.csv")
        assert rounds["round"].tolist() == list(range(SMOKE["rounds"] + 1))
        assert len(pd.read_csv(folder / "selection.csv")) == 6 * SMOKE["rounds"]
        for name in ("metrics.json", "privacy.json", "resources.json"):
            json.loads((folder / name).read_text())
        # The final model is an output; the checkpoint is removed once the outputs exist.
        assert (folder / "model.pt").is_file() and not (folder / "checkpoint.pt").exists()


def test_privacy_records(smoke):
    for aggregator, dpmode, eps in RUNS:
        priv = json.loads((_run(smoke, aggregator, dpmode, eps) / "privacy.json").read_text())
        if dpmode == "none":
            assert priv["guarantee"] == "none" and priv["epsilon"] is None
        elif dpmode == "paper":
            assert priv["guarantee"] == "paper-approximation"
            # the classic σ is a proven bound at eps0 <= 1: no reason there (exact eps < eps0)
            classic = [r for r in priv["reasons"] if "proven only for eps <= 1" in r]
            assert len(priv["reasons"]) >= 2 and len(classic) == (float(eps) > 1)
            assert priv["epsilon"] == pytest.approx(SMOKE["rounds"] * float(eps))  # T·eps0
            assert priv["extra"]["mechanisms_per_round"] > 1  # one per tensor
        else:
            assert priv["guarantee"] == "dp"
            assert priv["epsilon"] <= SMOKE["rounds"] * float(eps) + 1e-9
            assert priv["extra"]["mechanisms_per_round"] == 1


def test_simagg_learns(smoke):
    metrics = json.loads((_run(smoke, "simagg", "none", "inf") / "metrics.json").read_text())
    assert metrics["dice_WT"] > metrics["dice_WT_round0"] + 0.1
    assert metrics["dice_WT"] > 2 * metrics["dice_WT_round0"]


def test_tables_have_the_expected_rows(smoke):
    table = pd.read_csv(smoke / "results/tables/fets_table2.csv")
    assert len(table) == len(RUNS)
    assert {"SimAgg", "DP-SimAgg paper eps0=1", "DP-SimAgg paper eps0=10", "FedAvg",
            "DP-SimAgg sound eps0=1", "DP-FedAvg eps0=10"} <= set(table["method"])  # fmt: skip
    assert (table["dice_label0_mean"].between(0, 1)).all()
    privacy = pd.read_csv(smoke / "results/tables/fets_privacy.csv")
    assert len(privacy) == 6 * SMOKE["rounds"]  # six DP runs, one row per round
    sound = privacy[privacy["dpmode"] == "sound"]
    assert (sound["mechanisms"] == 1).all()
    assert (privacy["eps_basic_cum"] == privacy["round"] * privacy["eps"].astype(float)).all()
    resources = pd.read_csv(smoke / "results/measured/fets_resources.csv")
    assert (resources["wall_clock_s"] > 0).all() and resources["energy_method"].notna().all()


def test_figures_exist(smoke):
    for name in (
        "fets_fig1_patients_per_institution",
        "fets_fig2_modalities",
        "fets_fig3_selection",
        "fets_fig4_rounds",
    ):
        for ext in (".png", ".pdf"):
            assert (smoke / "results/figures" / f"{name}{ext}").stat().st_size > 1000
