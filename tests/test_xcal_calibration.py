"""XCal-FL at equal spent ε: its proven bound after all planned steps reaches the target within
the calibration tolerance (never above it), recomputed here by integration; and its random-σ_t
control is accounted by the same filter and bound (its σ_t schedule: test_xcal_like_for_like)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import XCAL_PARAMS, xcal_processed
from test_xcal_accounting import sampled_gaussian_rdp
from test_xcal_sampling import _opacus_epsilon

from dpmed.config.grid import job_seed
from dpmed.runtime import JobContext
from dpmed.xcal.calibration import BOUND_RTOL, calibrate
from dpmed.xcal.client import ClientAccount
from dpmed.xcal.methods import RANDOM_CONTROL, resolve
from dpmed.xcal.run import run

PARAMS = dict(XCAL_PARAMS)
TARGET = 3.0


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("xcal_calibration"), [120, 20, 40])


def _run(data: Path, out: Path, method: str) -> dict:
    wc = {"dataset": "bloodmnist", "model": "resnet18", "method": method, "shift": "iid",
          "clients": "2", "eps": f"{TARGET:g}", "seed": "0"}  # fmt: skip
    run(JobContext(data, out, wc, PARAMS, job_seed("xcal", wc), device="cpu", threads=1))
    return json.loads((out / "privacy.json").read_text())


def _offset(order: float, delta: float) -> float:
    return math.log((order - 1) / order) - (math.log(delta) + math.log(order)) / (order - 1)


def _one_order_bound(extra: dict, client: int, params: dict) -> float:
    """The bound at the filter's order α* recomputed from privacy.json: the signal's RDP over
    every planned step (by integration) + the filter's RDP budget B + c(α*, δ)."""
    q = extra["client_sample_rates"][client]
    planned = round(1 / q) * params["rounds"] * params["local_epochs"]
    order = extra["filter_order"][client]
    signal = planned * sampled_gaussian_rdp(q, extra["client_sigma_signal"][client], order)
    return signal + extra["filter_budget_rdp"][client] + _offset(order, params["delta"])


@pytest.mark.parametrize("method", ["xcal", RANDOM_CONTROL])
def test_the_final_proven_bound_reaches_the_target(data, tmp_path, method):
    privacy = _run(data, tmp_path, method)
    extra = privacy["extra"]
    assert privacy["guarantee"] == "dp"
    assert (1 - BOUND_RTOL) * TARGET <= privacy["epsilon"] <= TARGET
    for client, bound in enumerate(extra["client_epsilon"]):
        assert extra["client_calibration_scale"][client] > 1  # the split budget exceeds ε
        independent = _one_order_bound(extra, client, PARAMS)
        assert bound == pytest.approx(independent, rel=2e-4)
        assert (1 - BOUND_RTOL) * TARGET <= independent <= TARGET * (1 + 2e-4)


def test_static_dp_fl_spends_the_same_target(data, tmp_path):
    privacy = _run(data, tmp_path, "static")
    extra = privacy["extra"]
    for client, bound in enumerate(extra["client_epsilon"]):
        q = extra["client_sample_rates"][client]
        steps = extra["client_steps"][client]
        sigma = extra["client_sigma_ref"][client]
        assert bound == pytest.approx(_opacus_epsilon(sigma, q, steps), rel=1e-6)
    assert privacy["epsilon"] == pytest.approx(TARGET, rel=1e-4)


@pytest.mark.parametrize(
    ("eps", "q", "steps", "fraction", "band"),
    [(0.05, 1 / 19, 570, 0.1, 0.2), (0.5, 1 / 6, 30, 0.1, 0.2), (5.0, 1 / 3, 12, 0.1, 0.2),
     (50.0, 0.01, 3000, 0.3, 0.6), (5.0, 0.25, 1, 0.1, 0.2)],
)  # fmt: skip
def test_calibration_lands_in_the_window_below_the_target(eps, q, steps, fraction, band):
    budget = calibrate(eps, 1e-5, q, steps, fraction, band)
    assert (1 - BOUND_RTOL) * eps <= budget.bound <= eps
    assert budget.scale > 1  # splitting ε itself would end below the window


def _client(method: str, seed: int = 0) -> ClientAccount:
    entry = resolve(method, True, PARAMS["presets"])
    return ClientAccount.plan(0, 40, entry, PARAMS, TARGET, planned_rounds=2, control_seed=seed)


def test_random_control_is_accounted_as_xcal_fl_for_the_same_sigmas():
    xcal, control = _client("xcal"), _client(RANDOM_CONTROL)
    own, other = xcal.state, control.state
    for field in ("sigma_ref", "sigma_signal", "budget_scale"):
        assert getattr(own, field) == getattr(other, field)
    assert (own.filter.order, own.filter.budget) == (other.filter.order, other.filter.budget)
    rng = np.random.default_rng(0)
    sigmas = own.sigma_ref * rng.uniform(0.8, 1.2, xcal.total_steps)
    admitted = []
    for client in (xcal, control):
        state = client.state
        admitted.append([state.filter.admit(float(s)) for s in sigmas])
        client.rounds = 2
        state.signal_ledger.charge(client.q, state.sigma_signal, client.total_steps)
    assert admitted[0] == admitted[1]
    np.testing.assert_array_equal(own.ledger.rdp, other.ledger.rdp)
    assert control.epsilon() == xcal.epsilon() and control.epsilon() <= TARGET
    assert control.realised_epsilon() == xcal.realised_epsilon()
