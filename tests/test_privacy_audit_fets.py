"""One-run privacy audits of fets cells with canary collaborator updates
(`dpmed.fets.audit`): the canaries' local states, that they reach the real server as
more collaborators of the round, scaled noise, and the audits of sound DP-SimAgg, DP-FedAvg and
paper mode: perfect separation without noise, DP-FedAvg's bound above its claim at a tenth of
its noise, and every bound at the configured noise below the claim in seeded trials."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO
from test_fets_aggregation import rows

from dpmed.audit import AUDIT_FILE, audit_cell, main
from dpmed.data import fets
from dpmed.data.synthetic import fets as synthetic_fets
from dpmed.fets import run as fets_run
from dpmed.fets.aggregation import flatten_state, sound_release
from dpmed.fets.aggregators import RULES
from dpmed.fets.audit import AuditServer, UpdateCanaries
from dpmed.fets.audit import audit_cell as audit_fets_cell
from dpmed.fets.grid import server_config
from dpmed.fets.server import Server, ServerConfig
from dpmed.privacy.normals import NormalSource
from dpmed.runtime import JobContext

# The tiny federation of the fets simulation tests: 3 rounds of 6 of 33 collaborators.
PARAMS = {
    "rounds": 3, "participation": 0.2, "selection": "sliding_window", "local_epochs": 1,
    "lr": 0.01, "batch_size": 4, "patch_size": [16, 16, 16], "patches_per_subject": 2,
    "timing_samples_per_subject": 40,
    "base_filters": 2, "depth": 2, "norm": "group", "clip_norm": 100.0, "delta": 1e-5,
    "simagg_distance": "l2", "sound_calibration": "analytic", "hd95": False,
}  # fmt: skip
M = 500  # canaries: all 400 guesses correct bound ε by ≈ 4.31 at 95 % with δ = 3e-5


def fets_processed(root: Path) -> Path:
    """A tiny processed FeTS folder (2 partitions of the synthetic generator, 24×24×16)."""
    cfg = {"raw": "synthetic", "partitioning": "partitioning_2.csv", "val_fraction": 0.2,
           "split_seed": 0, "synthetic": {"shape": [24, 24, 16], "subjects_scale": 0.03,
                                          "seed": 0}}  # fmt: skip
    synthetic_fets.generate(root / "raw", "fets", cfg, seed=0)
    fets.preprocess(root / "raw", root / "processed", "fets", cfg)
    return root / "processed"


@pytest.fixture(scope="module")
def processed(tmp_path_factory) -> Path:
    return fets_processed(tmp_path_factory.mktemp("audit_fets"))


def fets_job(
    processed: Path, out: Path, aggregator: str, dpmode: str, eps: str = "1", seed: int = 11
) -> JobContext:
    wc = {"aggregator": aggregator, "dpmode": dpmode, "eps": eps, "seed": "0"}
    return JobContext(processed, out, wc, dict(PARAMS), seed, device="cpu", threads=1)


def test_canary_states_are_the_global_state_plus_or_minus_c_on_their_coordinate():
    state = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "b.bias": np.zeros(4)}
    canaries = UpdateCanaries(np.array([1, 7, 9]), np.array([True, False, True]), 2.5)
    local = canaries.locals(state, 7.0)
    before = flatten_state(state)
    for j, (name, s, weight) in enumerate(local):
        assert name == f"canary-{j}" and weight == 7.0
        expected = before.copy()
        expected[canaries.coordinates[j]] += 2.5 if canaries.included[j] else -2.5
        assert np.array_equal(flatten_state(s), expected)
        assert s["a.weight"].dtype == np.float32
    assert np.array_equal(flatten_state(state), before)  # the global state is untouched
    after = before.copy()
    after[[1, 7, 9]] += [0.5, -1.0, 2.0]
    assert np.array_equal(canaries.scores(before, after), [0.5, -1.0, 2.0])


def test_draw_picks_distinct_coordinates_and_about_half_included():
    canaries = UpdateCanaries.draw(1000, 400, 1.0, torch.Generator().manual_seed(0))
    assert len(set(canaries.coordinates.tolist())) == 400 and canaries.coordinates.max() < 1000
    assert 160 < canaries.included.sum() < 240
    with pytest.raises(ValueError, match="count"):
        UpdateCanaries.draw(10, 11, 1.0, torch.Generator())


def test_scaled_noise_scales_the_servers_draws():
    base = NormalSource(3).standard_normal(5, dtype=np.float32)
    scaled = NormalSource(3).scaled(0.1).standard_normal(5, dtype=np.float32)
    assert scaled.dtype == np.float32 and np.allclose(scaled, 0.1 * base, rtol=1e-6)
    updates = np.zeros((4, 5), dtype=np.float32)
    assert issubclass(AuditServer, Server)  # the real server, its generator scaled
    ones = np.ones(4)
    plain = sound_release(RULES["fedavg"], rows(updates), ones, 1.0, 2.0,
                          NormalSource(5))[0][""]  # fmt: skip
    quiet = sound_release(RULES["fedavg"], rows(updates), ones, 1.0, 2.0,
                          NormalSource(5).scaled(0.0))[0][""]  # fmt: skip
    assert np.abs(plain).sum() > 0 and not quiet.any()
    server = AuditServer(
        ServerConfig("dp_fedavg", "sound", 1.0, 1e-5, 1.0, "l2", "analytic", 0), 0.5
    )
    want = 0.5 * Server(server.cfg).generator(2).standard_normal(4)
    assert np.allclose(server.generator(2).standard_normal(4), want)


def test_canaries_reach_the_real_server_as_more_collaborators(processed):
    """σ = 0, DP-FedAvg: round 1 with canaries moves each canary coordinate by ±C/n (n = the
    chosen plus the canaries) more than the same round without them moves it, scaled by n0/n."""
    job = fets_job(processed, Path("."), "dp_fedavg", "sound")
    cfg = server_config(job.params, job.wildcards, job.seed)
    federation = fets_run.build_federation(job, torch.device("cpu"))
    state = fets_run.state_to_numpy(federation.model)
    chosen = [str(c) for c in federation.choices[0].collaborators]
    canaries = UpdateCanaries(np.array([5, 900, 2000]), np.array([True, False, True]), 100.0)
    server = AuditServer(cfg, 0.0)
    plain, _ = fets_run.aggregate_round(federation, server, state, chosen, 1)
    extra = canaries.locals(state, 1.0)
    mixed, mech = fets_run.aggregate_round(federation, server, state, chosen, 1, extra)
    before = flatten_state(state)
    n0, n = len(chosen), len(chosen) + 3
    moved = flatten_state(mixed) - before
    expected = (flatten_state(plain) - before) * n0 / n  # the real updates' mean, over n
    expected[[5, 900, 2000]] += np.array([100.0, -100.0, 100.0]) / n
    assert np.allclose(moved, expected, atol=1e-4)
    assert mech.delta_f == pytest.approx(2 * 100.0 / n)  # Δf = 2C/m counts the canaries


@pytest.mark.parametrize(
    ("aggregator", "dpmode"),
    [("dp_fedavg", "sound"), ("dp_simagg", "sound"), ("dp_simagg", "paper")],
)
def test_without_noise_every_aggregator_separates_the_canaries(
    processed, tmp_path, aggregator, dpmode
):
    audit = audit_cell(
        "fets", fets_job(processed, tmp_path, aggregator, dpmode), "update", M, 0.95, 0.0
    )
    result = audit.result
    assert result.correct == result.guesses == 400
    assert result.eps_lower > 4.0 > audit.eps_claimed  # measured ≈ 4.31 vs 1.87 (3 rounds)
    assert audit.mechanism == f"{aggregator}/{dpmode}" and audit.canary_norm == 100.0
    record = json.loads((tmp_path / AUDIT_FILE).read_text())
    assert record["study"] == "fets" and record["setting"] == "update"
    expected = "paper-approximation" if dpmode == "paper" else "dp"
    assert record["guarantee"] == expected


def test_dp_fedavg_at_a_tenth_of_its_noise_exceeds_its_claim(processed, tmp_path):
    audit = audit_fets_cell(
        fets_job(processed, tmp_path, "dp_fedavg", "sound"), "update", M, 0.95, 0.1
    )
    assert audit.guarantee == "dp" and audit.result.eps_lower > audit.eps_claimed  # 4.31 vs 1.87


@pytest.mark.parametrize(
    ("aggregator", "dpmode"),
    [("dp_fedavg", "sound"), ("dp_simagg", "sound"), ("dp_simagg", "paper")],
)
def test_at_the_configured_noise_the_bound_stays_below_the_claim(
    processed, tmp_path, aggregator, dpmode
):
    """Soundness on small settings: 5 seeded runs (job seeds 0..4: their own canaries, inclusion
    and noise), every bound ≤ the claimed ε (DP-FedAvg measured 0.09–0.65 of a claimed 1.87)."""
    for seed in range(5):
        job = fets_job(processed, tmp_path, aggregator, dpmode, seed=seed)
        audit = audit_fets_cell(job, "update", 200, 0.95)
        assert audit.result.eps_lower <= audit.eps_claimed


def test_non_private_fets_cells_and_unknown_settings_are_refused(processed, tmp_path):
    with pytest.raises(ValueError, match="not private"):
        audit_fets_cell(fets_job(processed, tmp_path, "fedavg", "none", "inf"), "update", M)
    with pytest.raises(ValueError, match="setting"):
        audit_fets_cell(fets_job(processed, tmp_path, "dp_fedavg", "sound"), "gradient", M)


def test_the_command_line_audits_a_smoke_fets_cell(processed, tmp_path, capsys):
    """The smoke config's DP-FedAvg ε0 = 1 cell, made cheaper by a second config file (2 rounds
    of the tiny model, as `--configfile` merges it): audit.json with the claim of 2 rounds."""
    overlay = tmp_path / "small.yaml"
    small = {"rounds": 2, "base_filters": 2, "patches_per_subject": 2}
    overlay.write_text(yaml.safe_dump({"fets": {"defaults": small}}))
    run = "results/fets/dp_fedavg/sound/eps1/seed0"
    args = [run, "--config", str(REPO / "config" / "smoke.yaml"), "--config", str(overlay)]
    args += ["--study", "fets", "--setting", "update", "--canaries", "50"]
    assert main([*args, "--processed", str(processed), "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / AUDIT_FILE).read_text())
    assert record["wildcards"]["aggregator"] == "dp_fedavg" and record["canaries"] == 50
    assert 1 < record["eps_claimed"] <= 2 and record["eps_lower"] <= record["eps_claimed"]
    assert "fets dp_fedavg/sound update: eps_lower" in capsys.readouterr().out
