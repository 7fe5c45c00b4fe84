"""The fets registries (aggregation rules, DP modes, the aggregators they make, SimAgg
distances, selection strategies): the config schema, the spec and the server read them; toy
rules registered here (one entry each) go through the server's code path under every DP mode
that accepts them and are removed again."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import REPO

from dpmed.config.checks import load_schema
from dpmed.config.wildcards import NUMBER_PATTERN
from dpmed.fets.aggregation import DP_MODES, DPMode, aggregator_mode, aggregators
from dpmed.fets.aggregators import RULES, SIMAGG_DISTANCES, AggregationRule, uniform_mean
from dpmed.fets.privacy import privacy_record
from dpmed.fets.report import method_label
from dpmed.fets.selection import STRATEGIES
from dpmed.fets.server import Server, ServerConfig
from dpmed.fets.spec import SPEC
from dpmed.privacy.mechanisms import analytic_sigma

SCHEMA = load_schema(REPO / "config" / "schema.yaml")["$defs"]


def test_schema_enums_equal_the_registries():
    # aggregators, DP modes and SimAgg distances are put in from the registries at load; the
    # selection strategies (dpmed.fets.selection needs pandas, which the spec does not import)
    # are listed in the schema
    params = SCHEMA["fets_params"]["properties"]
    assert params["selection"]["enum"] == list(STRATEGIES.names())


def test_spec_reads_the_registries():
    # a registered aggregator, optionally with a participation sweep's `-rho<ρ>` suffix
    assert SPEC.patterns["aggregator"] == (
        rf"(?:fedavg|simagg|dp_simagg|dp_fedavg)(?:-rho{NUMBER_PATTERN})?"
    )
    assert SPEC.patterns["dpmode"] == "none|paper|sound"
    valid = {
        (a, m, e)
        for a in aggregators()
        for m in DP_MODES
        for e in ("inf", "1")
        if SPEC.invalid({"aggregator": a, "dpmode": m, "eps": e, "seed": "0"}) is None
    }
    assert valid == {("fedavg", "none", "inf"), ("simagg", "none", "inf"),
                     ("dp_simagg", "paper", "1"), ("dp_simagg", "sound", "1"),
                     ("dp_fedavg", "sound", "1")}  # fmt: skip
    reason = SPEC.invalid({"aggregator": "dp_fedavg", "dpmode": "paper", "eps": "1", "seed": "0"})
    assert reason == "dp_fedavg has only the sound mode"


def test_sound_sensitivities_and_labels():
    assert aggregator_mode("dp_simagg", "sound").rule.sensitivity(3.0, 6) == 6.0  # 2C
    assert aggregator_mode("dp_fedavg", "sound").rule.sensitivity(3.0, 6) == 1.0  # 2C/m
    labels = [
        method_label({"aggregator": a, "dpmode": m, "eps": "1" if m != "none" else "inf"})
        for a in aggregators()
        for m in aggregators()[a].modes
    ]
    assert labels == ["FedAvg", "SimAgg", "DP-SimAgg paper eps0=1", "DP-SimAgg sound eps0=1",
                      "DP-FedAvg eps0=1"]  # fmt: skip


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known: fedavg, simagg, dp_simagg, dp_fedavg"):
        ServerConfig("fedprox", "none", None, 1e-5, 1.0, "l2", "analytic", 0)
    with pytest.raises(ValueError, match="has no DP mode 'paper'"):
        ServerConfig("dp_fedavg", "paper", 1.0, 1e-5, 1.0, "l2", "analytic", 0)
    with pytest.raises(ValueError, match="known: l2, sum_diff"):
        SIMAGG_DISTANCES["cosine"]


def test_a_private_mode_needs_its_mechanism_and_sensitivity():
    with pytest.raises(ValueError, match="mechanism"):
        AggregationRule("Toy", 9, weigh=uniform_mean, sensitivity=lambda c, m: c)
    with pytest.raises(ValueError, match="sensitivity"):
        AggregationRule("Toy", 9, weigh=uniform_mean, dp_weighting="toy")
    with pytest.raises(ValueError, match="reasons"):
        DPMode("paper-approximation", True, 9, lambda rule: True, print, lambda n, r: "toy")
    with pytest.raises(ValueError, match="mechanism"):
        DPMode("dp", False, 9, lambda rule: True, print)
    assert "toy" not in aggregators() and "dp_toy" not in aggregators()


def test_a_toy_median_aggregator_goes_through_the_server():
    def median_rule(local, tensor_name, cfg):
        return np.median(np.stack([t.tensor for t in local]), axis=0)

    RULES.add("median", AggregationRule("Median", 5, aggregate=median_rule))  # no weighted mean
    try:
        assert aggregators()["median"].modes == ("none",)  # no weighing: mode none only
        cfg = ServerConfig("median", "none", None, 1e-5, 1.0, "l2", "analytic", seed=0)
        base = {"a.weight": np.zeros(3), "a.bias": np.zeros(2)}
        local = [
            ("1", {"a.weight": np.array([1.0, 5.0, -2.0]), "a.bias": np.array([0.0, 1.0])}, 10.0),
            ("2", {"a.weight": np.array([3.0, 0.0, 7.0]), "a.bias": np.array([4.0, 2.0])}, 1.0),
            ("3", {"a.weight": np.array([2.0, 9.0, 1.0]), "a.bias": np.array([8.0, -3.0])}, 1.0),
        ]
        new, mech = Server(cfg).aggregate(base, local, fl_round=1)
        assert mech is None  # non-private: no mechanism, no privacy columns
        assert np.array_equal(new["a.weight"], [2.0, 5.0, 1.0])  # per-coordinate middle value
        assert np.array_equal(new["a.bias"], [4.0, 1.0])
        record = privacy_record(cfg, 3, {})
        assert record.guarantee == "none" and record.mechanism == "none (median, no noise)"
        key = {"aggregator": "median", "dpmode": "none", "eps": "inf", "seed": "0"}
        assert method_label(key) == "Median"
        assert SPEC.invalid(key) is None and SPEC.invalid({**key, "eps": "1"}) is not None
    finally:
        RULES.remove("median")
    assert "median" not in aggregators()
    with pytest.raises(ValueError, match="unknown fets aggregator 'median'"):
        ServerConfig("median", "none", None, 1e-5, 1.0, "l2", "analytic", seed=0)


def test_dp_modes_say_what_privacy_json_claims():
    assert [DP_MODES[m].guarantee for m in DP_MODES] == ["none", "paper-approximation", "dp"]
    assert [DP_MODES[m].private for m in DP_MODES] == [False, True, True]


def _squared_sizes(clipped, weights, distance):
    """A toy weighing: α_i = W_i² / Σ W²."""
    w = np.asarray(weights, dtype=np.float64) ** 2
    return w / w.sum()


def test_a_toy_rule_in_one_entry_runs_under_every_dp_mode_that_accepts_it():
    """One `RULES` entry gives the aggregators `toy` (mode none) and `dp_toy` (mode sound, the
    rule declares its sensitivity; paper needs the paper's rule): the server's aggregates equal
    the weighted mean by hand, and clip-then-mean plus numpy noise at the calibrated σ."""
    rule = AggregationRule("Toy", 7, weigh=_squared_sizes, sensitivity=lambda c, m: 2.0 * c,
                           dp_weighting="squared data-size weights, Delta f = 2C")  # fmt: skip
    base = {"a.weight": np.array([1.0, -1.0, 0.5]), "a.bias": np.array([0.0, 2.0])}
    updates = np.array([[3.0, 4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0, 1.0],
                        [6.0, 0.0, 0.0, 8.0, 0.0]])  # norms 5, √3, 10  # fmt: skip
    sizes = np.array([1.0, 2.0, 3.0])
    flat = np.r_[base["a.weight"], base["a.bias"]]
    local = [(str(i), {"a.weight": flat[:3] + u[:3], "a.bias": flat[3:] + u[3:]}, w)
             for i, (u, w) in enumerate(zip(updates, sizes, strict=True))]  # fmt: skip
    alpha = sizes**2 / (sizes**2).sum()
    RULES.add("toy", rule)
    try:
        assert aggregators()["toy"].modes == ("none",)
        assert aggregators()["dp_toy"].modes == ("sound",)
        assert [m for m in DP_MODES if DP_MODES[m].accepts(rule)] == ["none", "sound"]
        with pytest.raises(ValueError, match="has no DP mode 'paper'"):
            ServerConfig("dp_toy", "paper", 1.0, 1e-5, 1.0, "l2", "analytic", seed=0)

        plain = ServerConfig("toy", "none", None, 1e-5, 1.0, "l2", "analytic", seed=0)
        new, mech = Server(plain).aggregate(base, local, fl_round=1)
        want = flat + alpha @ updates  # Σ α_i x_i = o + Σ α_i u_i, as Σ α = 1
        assert mech is None
        assert np.allclose(np.r_[new["a.weight"], new["a.bias"]], want, rtol=0, atol=1e-12)

        c, eps0, delta0 = 4.0, 1.0, 1e-5
        cfg = ServerConfig("dp_toy", "sound", eps0, delta0, c, "l2", "analytic", seed=0)

        class NumpyNoise(Server):
            def generator(self, fl_round):
                return np.random.default_rng(11)

        new, mech = NumpyNoise(cfg).aggregate(base, local, fl_round=1)
        norms = np.linalg.norm(updates, axis=1)
        clipped = updates * np.minimum(1.0, c / norms)[:, None]
        sigma = analytic_sigma(2.0 * c, eps0, delta0)
        noise = np.random.default_rng(11).standard_normal(5)
        want = flat + alpha @ clipped + sigma * noise
        assert mech.delta_f == 2.0 * c and mech.sigma == pytest.approx(sigma, rel=1e-12)
        assert np.allclose(np.r_[new["a.weight"], new["a.bias"]], want, rtol=0, atol=1e-12)
        assert np.allclose(mech.alpha, alpha)

        key = {"aggregator": "dp_toy", "dpmode": "sound", "eps": "1", "seed": "0"}
        assert method_label(key) == "DP-Toy eps0=1" and SPEC.invalid(key) is None
        last = {"mechanisms": 1, "delta_f": mech.delta_f, "sigma": mech.sigma,
                "noise_multiplier": mech.noise_multiplier, "eps_basic_cum": 3.0,
                "eps_rdp_cum": math.inf}  # fmt: skip
        record = privacy_record(cfg, 3, last)
        assert record.guarantee == "dp" and record.mechanism.startswith(
            "DP-Toy: whole-model updates clipped jointly to C, squared data-size weights, "
            "Delta f = 2C; one Gaussian mechanism per round"
        )
    finally:
        RULES.remove("toy")
    assert "toy" not in aggregators() and "dp_toy" not in aggregators()
