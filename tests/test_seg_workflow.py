"""The seg part of the smoke DAG, run once: every run's outputs, privacy, tables, figures."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG

from dpmed.config.checks import check_config
from dpmed.config.wildcards import parse_eps
from dpmed.privacy.clipping import CLIP_RULES
from dpmed.seg.grid import clip_overrides, clip_rule, is_paper_cell
from dpmed.seg.morphology import morph_kind
from dpmed.seg.outputs import ATTACK_FILE, RUN_FILES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(smoke_run):
    """(workdir, jobs): the shared smoke run and the seg jobs of config/smoke.yaml."""
    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    return smoke_run, check_config(config, REPO / "config" / "schema.yaml").jobs("seg")


def test_smoke_grid_covers_the_issue(smoke):
    _, jobs = smoke
    wcs = [job.wc for job in jobs]
    assert {wc["model"] for wc in wcs} == {"unet", "unetpp", "lfunet", "infnet"}
    assert {clip_rule(wc["clip"]) for wc in wcs} == set(CLIP_RULES)
    assert any(clip_overrides(wc["clip"]) for wc in wcs)  # the Fig. 2 lr × C sweep
    assert any("-q" in wc["morph"] for wc in wcs) and any(wc["morph"].endswith("-s") for wc in wcs)
    kinds = {"none" if m == "none" else m.split("-")[0] for m in (wc["morph"] for wc in wcs)}
    assert {"none", "adaptive"} <= kinds and kinds & {"open", "close", "both"}
    cells = pd.DataFrame(wcs).groupby(["dataset", "model", "clip", "morph", "eps"]).size()
    assert cells.max() >= 2
    assert all(job.params["epochs"] >= 2 for job in jobs)


def test_every_run_has_its_outputs_and_privacy(smoke):
    workdir, jobs = smoke
    for job in jobs:
        folder = workdir / job.path
        for name in RUN_FILES:
            assert (folder / name).exists(), folder / name
        # attack.json exactly where the block's attack is on (`attack: false` blocks skip it)
        assert (folder / ATTACK_FILE).exists() == job.switches["attack"], folder
        assert not (folder / "checkpoint.pt").exists()
        privacy = json.loads((folder / "privacy.json").read_text())
        history = pd.read_csv(folder / "diagnostics/history.csv")
        assert len(history) == job.params["epochs"]
        eps = parse_eps(job.wc["eps"])
        if not CLIP_RULES[clip_rule(job.wc["clip"])].bounded:
            assert privacy["guarantee"] == "none"
        elif morph_kind(job.wc["morph"]) == "adaptive" and not job.wc["morph"].endswith("-s"):
            assert privacy["guarantee"] == "paper-approximation"
        else:
            assert privacy["epsilon"] <= eps + 0.01
            assert privacy["epsilon_by_accountant"]["prv"] <= eps + 0.5
            assert privacy["noise_multipliers"][0] > 0
            assert privacy["extra"]["clip_rule"] == clip_rule(job.wc["clip"])
            assert privacy["clip_norm"] == job.params["clip_norm"]
        metrics = json.loads((folder / "metrics.json").read_text())
        assert 0 <= metrics["dice"] <= 1 and 0 <= metrics["mae"] <= 1
        if job.wc["dataset"] == "covidct":
            assert 0 <= metrics["s_alpha"] <= 1 and 0 <= metrics["e_phi"] <= 1.1


def test_training_reduces_the_loss_of_non_private_runs(smoke):
    workdir, jobs = smoke
    for job in jobs:
        if job.wc["clip"] == "none":
            history = pd.read_csv(workdir / job.path / "diagnostics/history.csv")
            assert history["loss"].iloc[-1] < history["loss"].iloc[0], job.path


def test_tables_have_one_row_per_cell(smoke):
    workdir, jobs = smoke
    frame = pd.DataFrame([job.wc for job in jobs if is_paper_cell(job.wc)])
    for dataset, sub in frame.groupby("dataset"):
        table = pd.read_csv(workdir / f"results/tables/seg_main_{dataset}.csv")
        assert len(table) == len(sub.drop(columns="seed").drop_duplicates())
        assert table["n_seeds"].sum() == len(sub)
        assert ("S_alpha" in table.columns) == (dataset == "covidct")
        assert (workdir / f"results/tables/seg_main_{dataset}.md").exists()


def test_figures_exist(smoke):
    workdir, _ = smoke
    figures = [f"seg_fig{n}" for n in (1, 2, 6, 7, 9, 10, 11, 12)]
    for name in [*figures, "seg_fig3_duke", "seg_fig4_umn", "seg_fig5_covidct"]:
        png = next((workdir / "results/figures").glob(f"{name}*.png"))
        assert png.stat().st_size > 1000 and png.with_suffix(".pdf").exists()
    assert (workdir / "results/measured/seg_fig8_training_time.png").stat().st_size > 1000
    for name in ("seg_table1_clip_rules", "seg_table2_quantiles", "seg_privacy", "seg_attack"):
        assert len(pd.read_csv(workdir / f"results/tables/{name}.csv")) > 0
