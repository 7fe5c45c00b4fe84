"""The fets ε0 × collaborators-per-round sweep: a block's `sweep` expands into one job per
participation ρ with ρ in the aggregator wildcard (apart from Table II's cells), the sweep's
figure and table on fake runs against a hand computation, the sound modes' σ against m, and the
job cost of a sweep job."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG
from scipy import stats

from dpmed import job_cost
from dpmed.config.checks import check_config, load_configs
from dpmed.config.grid import Grid, expand_study, wildcards_from_path
from dpmed.fets import report
from dpmed.fets.grid import aggregator_name, sweep_jobs, table_jobs
from dpmed.fets.outputs import REPORTS
from dpmed.fets.server import ServerConfig
from dpmed.fets.spec import SPEC
from dpmed.models import parameter_count

SCHEMA = REPO / "config" / "schema.yaml"
SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())


def fets_config(*blocks: dict) -> dict:
    config = copy.deepcopy(SMOKE)
    config["fets"]["grid"] = list(blocks)
    return config


TABLE_BLOCK = {"aggregators": ["dp_fedavg"], "dpmodes": ["sound"], "eps": [1], "seeds": [0]}
SWEEP_BLOCK = {"aggregators": ["fedavg", "dp_simagg", "dp_fedavg"],
               "dpmodes": ["none", "paper", "sound"], "eps": [1, 100, "inf"], "seeds": [0],
               "sweep": {"participation": [0.2, 1.0]}}  # fmt: skip


def test_the_sweep_expands_to_the_hand_listed_jobs():
    jobs = expand_study(fets_config(TABLE_BLOCK, SWEEP_BLOCK), "fets")
    got = [(job.path, job.params["participation"]) for job in jobs]
    expected = [("results/fets/dp_fedavg/sound/eps1/seed0", 0.2)]  # Table II cell, plain path
    for aggregator, dpmode, eps in [
        ("fedavg", "none", "inf"),
        ("dp_simagg", "paper", "1"), ("dp_simagg", "paper", "100"),
        ("dp_simagg", "sound", "1"), ("dp_simagg", "sound", "100"),
        ("dp_fedavg", "sound", "1"), ("dp_fedavg", "sound", "100"),
    ]:  # fmt: skip
        for rho, spelled in ((0.2, "0.2"), (1.0, "1")):
            path = f"results/fets/{aggregator}-rho{spelled}/{dpmode}/eps{eps}/seed0"
            expected.append((path, rho))
    assert sorted(got) == sorted(expected)
    assert len(got) == 15  # nothing else, no duplicates
    # The sweep's ρ = 0.2 runs stay apart from the Table II cell they equal in every setting.
    assert table_jobs(jobs) == jobs[:1] and sweep_jobs(jobs) == jobs[1:]
    assert len({job.path for job in jobs}) == len(jobs)


def test_swept_paths_parse_back_and_off_grid_targets_take_their_rho():
    config = fets_config(TABLE_BLOCK, SWEEP_BLOCK)
    grid = Grid(config)
    path = "results/fets/dp_fedavg-rho0.5/sound/eps3/seed4/metrics.json"
    wc = wildcards_from_path("fets", path)
    assert wc == {"aggregator": "dp_fedavg-rho0.5", "dpmode": "sound", "eps": "3", "seed": "4"}
    assert grid.params("fets", wc)["participation"] == 0.5  # not in the grid: from the path
    assert grid.params("fets", {**wc, "aggregator": "dp_fedavg"})["participation"] == 0.2
    assert aggregator_name("dp_fedavg-rho0.5") == "dp_fedavg"
    pattern = re.compile(SPEC.patterns["aggregator"])
    assert pattern.fullmatch("dp_simagg-rho1") and pattern.fullmatch("fedavg-rho0.25")
    assert not pattern.fullmatch("dp_simagg-rho") and not pattern.fullmatch("median-rho1")
    assert SPEC.invalid({"aggregator": "dp_fedavg-rho1", "dpmode": "paper", "eps": "1",
                         "seed": "0"}) == "dp_fedavg has only the sound mode"  # fmt: skip


def test_table2_reads_only_plain_cells_and_the_sweep_figure_only_swept_runs():
    jobs = expand_study(fets_config(TABLE_BLOCK, SWEEP_BLOCK), "fets")
    plain, swept = "results/fets/dp_fedavg/sound/eps1/seed0", "-rho"
    for name in ("fets_table2", "fets_resources_table", "fets_privacy_table", "fets_figure4"):
        entry = REPORTS[name]
        assert entry.params(jobs, {})["run_dirs"] == [plain], name
        assert all(swept not in f for files in entry.inputs(jobs).values() for f in files)
    entry = REPORTS["fets_eps_sweep"]
    assert entry.params(jobs, {})["run_dirs"] == [job.path for job in jobs[1:]]
    assert entry.targets(jobs) == ["results/figures/fets_eps_sweep.png"]
    assert entry.targets(jobs[:1]) == []  # no sweep block, no figure
    assert REPORTS["fets_table2"].targets(jobs[1:]) == []  # only a sweep: no Table II


def test_both_shipped_configs_have_a_sweep_block():
    for files, rhos in (([SMOKE_CONFIG], {0.2, 1.0}), ([], {0.2, 0.4, 0.7, 1.0})):
        config = load_configs(files)
        jobs = check_config(config, SCHEMA).jobs("fets")
        swept = sweep_jobs(jobs)
        assert {job.params["participation"] for job in swept} == rhos
        cells = {tuple(v for k, v in job.wc.items() if k != "seed") for job in table_jobs(jobs)}
        assert len(cells) == 8  # Table II's cells unchanged (the paper config runs more seeds)


# --- the figure and its table on fake runs ---------------------------------------------------


def fake_run(root: Path, aggregator: str, dpmode: str, eps: str, seed: int, m: int,
             dice: float, sigma: list[float], sigma_min: list[float]) -> Path:  # fmt: skip
    """A run folder with the files the sweep reads: 2 rounds of m collaborators."""
    run = root / f"results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}"
    run.mkdir(parents=True)
    metrics = {"dice_WT": dice, "dice_mean_labels": dice / 2, "dice_WT_round0": 0.1,
               "rounds": 2, "n_parameters": 1234}  # fmt: skip
    (run / "metrics.json").write_text(json.dumps(metrics))
    rounds = {"round": [0, 1, 2], "sigma": [math.nan, *sigma],
              "sigma_min": [math.nan, *sigma_min], "delta_f": [math.nan, 4.0, 4.0]}  # fmt: skip
    pd.DataFrame(rounds).to_csv(run / "rounds.csv", index=False)
    selection = [(r, c) for r in (1, 2) for c in range(m)]
    pd.DataFrame(selection, columns=["round", "collaborator"]).to_csv(run / "selection.csv")
    return run


@pytest.fixture
def sweep_runs(tmp_path: Path) -> list[Path]:
    nan = [math.nan, math.nan]
    return [
        fake_run(tmp_path, "fedavg-rho1", "none", "inf", 0, 33, 0.6, nan, nan),
        fake_run(tmp_path, "fedavg-rho1", "none", "inf", 1, 33, 0.8, nan, nan),
        fake_run(tmp_path, "dp_fedavg-rho1", "sound", "100", 0, 33, 0.5, [2.0, 2.0], [2.0, 2.0]),
        fake_run(tmp_path, "dp_fedavg-rho1", "sound", "100", 1, 33, 0.7, [2.0, 2.0], [2.0, 2.0]),
        fake_run(tmp_path, "dp_fedavg-rho1", "sound", "1", 0, 33, 0.1, [9.0, 9.0], [9.0, 9.0]),
        fake_run(tmp_path, "dp_fedavg-rho1", "sound", "1", 1, 33, 0.1, [9.0, 9.0], [9.0, 9.0]),
        fake_run(tmp_path, "dp_simagg-rho0.2", "paper", "1", 0, 6, 0.3, [5.0, 7.0], [1.0, 3.0]),
    ]


def test_sweep_table_against_a_hand_computation(sweep_runs, tmp_path):
    table = report.sweep_table(report.runs_frame(sweep_runs[::-1]))
    # m first, then the registered order (DP-SimAgg paper 0, FedAvg 3, DP-FedAvg 4), then eps0
    assert table[["method", "m", "eps", "n_seeds"]].values.tolist() == [
        ["DP-SimAgg paper", 6, "1", 1], ["FedAvg", 33, "inf", 2],
        ["DP-FedAvg", 33, "1", 2], ["DP-FedAvg", 33, "100", 2],
    ]  # fmt: skip
    assert table["rho"].tolist() == [0.2, 1.0, 1.0, 1.0]
    half = 12.7062047 * np.std([0.5, 0.7], ddof=1) / np.sqrt(2)  # t(0.975, 1) · s / √n
    row = table.iloc[3]
    assert row["dice_WT_mean"] == pytest.approx(0.6)
    assert row["dice_WT_ci_low"] == pytest.approx(0.6 - half)
    assert row["dice_WT_ci_high"] == pytest.approx(0.6 + half)
    assert row["dice_mean_labels_mean"] == pytest.approx(0.3)
    # gain over the untrained 0.1 relative to FedAvg's (mean 0.7) at the same m
    assert row["gain_fraction"] == pytest.approx((0.6 - 0.1) / (0.7 - 0.1))
    assert table.iloc[2]["gain_fraction"] == pytest.approx(0.0)
    assert math.isnan(table.iloc[0]["gain_fraction"])  # no SimAgg at m = 6 in this sweep
    assert math.isnan(table.iloc[1]["gain_fraction"]) and math.isnan(table.iloc[1]["sigma_max"])
    assert table.iloc[0][["sigma_min", "sigma_max"]].tolist() == [1.0, 7.0]  # over rounds
    assert table.iloc[2][["sigma_min", "sigma_max", "delta_f_max"]].tolist() == [9.0, 9.0, 4.0]
    assert row["dice_WT_round0_mean"] == pytest.approx(0.1)


def test_sweep_figure_draws_one_panel_per_m_and_is_byte_identical(sweep_runs, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    shown = {}
    real_save = report.save_figure

    def keep(fig, path):
        shown[path] = [(ax.get_title(), ax.get_lines()) for ax in fig.axes]
        real_save(fig, path)

    monkeypatch.setattr(report, "save_figure", keep)
    for name in ("a", "b"):
        report.eps_sweep(sweep_runs, tmp_path / name / "s.png", tmp_path / name / "s.csv")
    panels = shown[tmp_path / "a" / "s.png"]
    assert [title for title, _ in panels] == [
        "m = 6 collaborators per round (rho = 0.2)",
        "m = 33 collaborators per round (rho = 1)",
    ]
    lines = {line.get_label(): line for line in panels[1][1]}
    dp = lines["DP-FedAvg"]
    assert list(dp.get_xdata()) == [1.0, 100.0] and np.allclose(dp.get_ydata(), [0.1, 0.6])
    assert np.allclose(lines["FedAvg (no DP)"].get_ydata(), 0.7)  # the mean of 0.6 and 0.8
    assert np.allclose(lines["untrained (round 0)"].get_ydata(), 0.1)
    for ext in (".png", ".pdf", ".csv"):
        first, second = (tmp_path / n / f"s{ext}" for n in ("a", "b"))
        assert first.read_bytes() == second.read_bytes()


def test_m_is_read_from_the_selection_log(tmp_path):
    pd.DataFrame({"round": [1, 1, 2], "collaborator": [3, 4, 5]}).to_csv(tmp_path / "s.csv")
    with pytest.raises(ValueError, match="rounds choose"):
        report.collaborators_per_round(tmp_path / "s.csv")


# --- σ per coordinate against m ---------------------------------------------------------------


def analytic_delta(sigma: float, sensitivity: float, eps: float) -> float:
    """δ(ε) of the Gaussian mechanism N(0, σ²) with L2 sensitivity Δ (Balle & Wang 2018, Thm 8):
    Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ)."""
    a, b = sensitivity / (2 * sigma), eps * sigma / sensitivity
    return float(stats.norm.cdf(a - b) - math.exp(eps) * stats.norm.cdf(-a - b))


@pytest.mark.parametrize("eps", [1.0, 100.0])
def test_sound_sigma_per_coordinate_falls_as_1_over_m_for_dp_fedavg_only(eps):
    def sigma(aggregator: str, m: int) -> float:
        cfg = ServerConfig(aggregator, "sound", eps, 1e-5, 100.0, "l2", "analytic", 0)
        return cfg.mode.sound_sigma(cfg, m)[0]

    ms = (6, 13, 23, 33)
    fedavg = [sigma("dp_fedavg", m) for m in ms]
    for m, value in zip(ms, fedavg, strict=True):
        # calibrated exactly for Δ = 2C/m at (ε0, δ0): the analytic Gaussian's δ(ε0) is δ0
        assert analytic_delta(value, 2 * 100.0 / m, eps) == pytest.approx(1e-5, rel=1e-3)
        assert value * m == pytest.approx(fedavg[0] * ms[0], rel=1e-6)  # σ ∝ 1/m
    simagg = {sigma("dp_simagg", m) for m in ms}
    assert len(simagg) == 1  # Δ = 2C whatever m
    assert analytic_delta(simagg.pop(), 2 * 100.0, eps) == pytest.approx(1e-5, rel=1e-3)


# --- job cost ----------------------------------------------------------------------------------


def test_a_sweep_jobs_cost_counts_its_collaborators_per_round():
    config = load_configs([SMOKE_CONFIG])
    grid = check_config(config, SCHEMA)
    cost = {}
    for job in sweep_jobs(grid.jobs("fets")):
        if job.wc["dpmode"] == "none":
            hp = grid.params("fets", job.wc)
            cost[hp["participation"]] = job_cost.features("fets_train", config, job.wc, hp)
    (mem6, time6), (mem33, time33) = cost[0.2], cost[1.0]
    assert time33["train"] == pytest.approx(time6["train"] * 33 / 6)  # m local trainings
    assert time33["val"] == pytest.approx(time6["val"])  # every collaborator validates
    params = parameter_count("resunet3d", in_channels=4, n_classes=4, base_filters=4,
                                      depth=2, norm="group")  # fmt: skip
    assert mem33["host"] - mem6["host"] == pytest.approx((33 - 6) * params * 8 / 1e6)


# --- one swept run end to end ------------------------------------------------------------------


def test_a_swept_run_trains_m_collaborators_and_records_their_sigma(tmp_path):
    from dpmed.data import fets
    from dpmed.data.synthetic import fets as synthetic_fets
    from dpmed.fets.run import run
    from dpmed.privacy.mechanisms import calibrate
    from dpmed.runtime import JobContext

    data = {"raw": "synthetic", "partitioning": "partitioning_2.csv", "val_fraction": 0.2,
            "split_seed": 0, "synthetic": {"shape": [24, 24, 16], "subjects_scale": 0.03,
                                           "seed": 0}}  # fmt: skip
    synthetic_fets.generate(tmp_path / "raw", "fets", data, seed=0)
    fets.preprocess(tmp_path / "raw", tmp_path / "processed", "fets", data)
    params = {**SMOKE["fets"]["defaults"], "rounds": 1, "participation": 0.4, "base_filters": 2,
              "patches_per_subject": 1}  # fmt: skip
    wc = {"aggregator": "dp_fedavg-rho0.4", "dpmode": "sound", "eps": "1", "seed": "0"}
    out = tmp_path / "results/fets/dp_fedavg-rho0.4/sound/eps1/seed0"
    metrics = run(JobContext(tmp_path / "processed", out, wc, params, 5, device="cpu", threads=1))
    assert metrics["aggregator"] == "dp_fedavg"  # the registered name, ρ is in the params
    row = report.run_row(out)
    assert (row["m"], row["rho"], row["aggregator"]) == (13, 0.4, "dp_fedavg")  # ⌊0.4 · 33⌋
    sigma = calibrate("analytic", 2 * 100 / 13, 1.0, 1e-5)  # Δf = 2C/m
    assert row["sigma_min"] == row["sigma_max"] == pytest.approx(sigma, rel=1e-12)


def test_the_sweep_title_fits_the_figure_and_clears_the_panel_titles(sweep_runs, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    boxes = {}

    def measure(fig, path):
        renderer = fig.canvas.get_renderer()
        title = fig._suptitle.get_window_extent(renderer)
        panel = fig.axes[0].title.get_window_extent(renderer)
        saved = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)  # what is saved
        boxes.update(title=title, panel=panel, saved=saved)

    monkeypatch.setattr(report, "save_figure", measure)
    report.eps_sweep(sweep_runs, tmp_path / "s.png", tmp_path / "s.csv")
    title, saved = boxes["title"], boxes["saved"]
    # one long line set the saved area's edges itself, its last glyphs cut at the right edge;
    # the title now stays inside what the panels and legend span
    assert saved.x0 < title.x0 and title.x1 < saved.x1
    assert title.y0 >= boxes["panel"].y1  # and it does not overlap the panel titles
