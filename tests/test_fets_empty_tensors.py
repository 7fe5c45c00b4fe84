"""A model state with size-0 tensors aggregates in every fets DP mode (issue 53): an empty
tensor contributes nothing to norms, Gram matrices and weights, draws no noise and is no
mechanism, so every other tensor and the round's record are those of the same round without
it. Paper mode crashed on it (`RoundTensors.gram` summed no blocks to the integer 0)."""

from __future__ import annotations

import numpy as np
import pytest
from openfl.databases import TensorDB
from openfl.utilities import TensorKey, change_tags

from dpmed.fets.aggregation import aggregators
from dpmed.fets.aggregators import LocalTensor
from dpmed.fets.openfl_adapter import fets_dp_simagg
from dpmed.fets.round_tensors import RoundTensors
from dpmed.fets.server import Server, ServerConfig

EMPTY = {"a.empty.weight": (0, 3), "c.empty.bias": (0,)}  # first and between the others
FULL = {"b.conv.weight": (2, 3), "d.norm.bias": (4,), "e.scale": (3,)}
ORDER = ["a.empty.weight", "b.conv.weight", "c.empty.bias", "d.norm.bias", "e.scale"]
WEIGHTS = [0.5, 0.3, 0.2]
PAIRS = [(name, mode) for name in aggregators() for mode in aggregators()[name].modes]


def _round(with_empty: bool) -> tuple[dict[str, np.ndarray], list[tuple[str, dict, float]]]:
    """The global state and three collaborators' states (float32), with or without the
    size-0 tensors; the non-empty values are the same either way."""
    rng = np.random.default_rng(7)
    shapes = {**FULL, **EMPTY}
    glob = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in ORDER}
    local = [
        (f"c{i}", {n: (v + (i + 1) * rng.standard_normal(v.shape)).astype(np.float32)
                   for n, v in glob.items()}, w)
        for i, w in enumerate(WEIGHTS)
    ]  # fmt: skip
    if not with_empty:
        glob = {n: v for n, v in glob.items() if n not in EMPTY}
        local = [(c, {n: v for n, v in s.items() if n not in EMPTY}, w) for c, s, w in local]
    return glob, local


@pytest.mark.parametrize(("aggregator", "dpmode"), PAIRS, ids=[f"{a}-{m}" for a, m in PAIRS])
def test_size_0_tensors_change_nothing_in_any_mode(aggregator: str, dpmode: str) -> None:
    private = aggregators()[aggregator].private
    cfg = ServerConfig(aggregator, dpmode, 2.0 if private else None, 1e-5, 1.5, "l2", "analytic",
                       seed=3)  # fmt: skip
    got, got_mech = Server(cfg).aggregate(*_round(with_empty=True), fl_round=2)
    want, want_mech = Server(cfg).aggregate(*_round(with_empty=False), fl_round=2)
    assert list(got) == ORDER
    for name, shape in EMPTY.items():
        assert got[name].shape == shape and got[name].dtype == np.float32
    for name in FULL:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got_mech == want_mech  # no mechanism, σ or Δf for an empty tensor
    if dpmode == "paper":
        assert got_mech.mechanisms == len(FULL)


def test_fedavg_with_size_0_tensors_is_the_weighted_mean_by_hand() -> None:
    cfg = ServerConfig("fedavg", "none", None, 1e-5, 1.0, "l2", "analytic", seed=0)
    glob, local = _round(with_empty=True)
    got, _ = Server(cfg).aggregate(glob, local, fl_round=1)
    for name in ORDER:
        want = sum(w * s[name].astype(np.float64) for _, s, w in local) / sum(WEIGHTS)
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)


def test_gram_of_a_model_with_size_0_tensors_is_the_gram_by_hand() -> None:
    glob, local = _round(with_empty=True)
    updates = RoundTensors.updates(glob, [s for _, s, _ in local])
    v = np.stack([np.concatenate([(s[n].astype(np.float64) - glob[n]).ravel() for n in ORDER])
                  for _, s, _ in local])  # fmt: skip
    basis = np.vstack([v[0], v[1:] - v[0], np.ones(v.shape[1])])
    np.testing.assert_allclose(updates.gram(), basis @ basis.T, rtol=1e-12)
    only_empty = RoundTensors.updates({n: glob[n] for n in EMPTY},
                                      [{n: s[n] for n in EMPTY} for _, s, _ in local])  # fmt: skip
    assert np.array_equal(only_empty.gram([0.5, 1.0, 2.0]), np.zeros((4, 4)))


def test_openfl_paper_adapter_passes_size_0_tensors_without_a_mechanism() -> None:
    glob, local = _round(with_empty=True)
    uuid = "aggregator_fets_00000000"
    db = TensorDB()
    db.cache_tensor({TensorKey(n, uuid, 0, False, ("model",)): v for n, v in glob.items()})
    for c, state, _ in local:
        tags = change_tags(("trained",), add_field=c)
        db.cache_tensor({TensorKey(n, uuid, 0, False, tags): v for n, v in state.items()})
    fn = fets_dp_simagg(2.0, 1e-5, clip_norm=1.5, mode="paper", seed=4)
    for name in ORDER:
        tensors = [LocalTensor(c, s[name], w) for c, s, w in local]
        out = fn(tensors, db.tensor_db, name, 0, None, None)
        assert out.shape == glob[name].shape and np.all(np.isfinite(out))
    assert fn.records[-1]["mechanisms"] == len(FULL)
