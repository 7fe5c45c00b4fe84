"""The fets registries (aggregators, DP modes, SimAgg distances, selection strategies): the
config schema, the spec and the server read them; a toy aggregator registered here goes
through the server's code path and is removed again."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import REPO

from dpmed.config.wildcards import NUMBER_PATTERN
from dpmed.fets.aggregation import (
    AGGREGATORS,
    DP_MODES,
    SIMAGG_DISTANCES,
    aggregator_mode,
    register_aggregator,
)
from dpmed.fets.privacy import privacy_record
from dpmed.fets.report import method_label
from dpmed.fets.selection import STRATEGIES
from dpmed.fets.server import Server, ServerConfig
from dpmed.fets.spec import SPEC

SCHEMA = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())["$defs"]


def test_schema_enums_equal_the_registries():
    grid = SCHEMA["fets"]["properties"]["grid"]["items"]["properties"]
    assert grid["aggregators"]["items"]["enum"] == list(AGGREGATORS.names())
    assert grid["dpmodes"]["items"]["enum"] == list(DP_MODES.names())
    params = SCHEMA["fets_params"]["properties"]
    assert params["selection"]["enum"] == list(STRATEGIES.names())
    assert params["simagg_distance"]["enum"] == list(SIMAGG_DISTANCES.names())


def test_spec_reads_the_registries():
    # a registered aggregator, optionally with a participation sweep's `-rho<ρ>` suffix
    assert SPEC.patterns["aggregator"] == (
        rf"(?:fedavg|simagg|dp_simagg|dp_fedavg)(?:-rho{NUMBER_PATTERN})?"
    )
    assert SPEC.patterns["dpmode"] == "none|paper|sound"
    valid = {
        (a, m, e)
        for a in AGGREGATORS
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
    assert aggregator_mode("dp_simagg", "sound").sensitivity(3.0, 6) == 6.0  # 2C
    assert aggregator_mode("dp_fedavg", "sound").sensitivity(3.0, 6) == 1.0  # 2C/m
    labels = [
        method_label({"aggregator": a, "dpmode": m, "eps": "1" if m != "none" else "inf"})
        for a in AGGREGATORS
        for m in AGGREGATORS[a].modes
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
        register_aggregator("toy", "sound", label="Toy", order=9, sensitivity=lambda c, m: c)
    with pytest.raises(ValueError, match="sensitivity"):
        register_aggregator("toy", "sound", label="Toy", order=9, mechanism="toy")
    with pytest.raises(ValueError, match="reasons"):
        register_aggregator("toy", "paper", label="Toy", order=9, mechanism="toy")
    assert "toy" not in AGGREGATORS


def test_a_toy_median_aggregator_goes_through_the_server():
    @register_aggregator("median", "none", label="Median", order=5)
    def median_rule(local, tensor_name, cfg):
        return np.median(np.stack([t.tensor for t in local]), axis=0)

    try:
        assert AGGREGATORS.names()[-1] == "median"
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
        AGGREGATORS.remove("median")
    assert "median" not in AGGREGATORS
    with pytest.raises(ValueError, match="unknown fets aggregator 'median'"):
        ServerConfig("median", "none", None, 1e-5, 1.0, "l2", "analytic", seed=0)


def test_dp_modes_say_what_privacy_json_claims():
    assert [DP_MODES[m].guarantee for m in DP_MODES] == ["none", "paper-approximation", "dp"]
    assert [DP_MODES[m].private for m in DP_MODES] == [False, True, True]
