"""fets aggregators against hand computations (Algorithms 1–3) and the sound-mode bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dpmed.fets import aggregation as agg
from dpmed.fets import aggregators as rules
from dpmed.fets.round_tensors import RoundTensors, TensorGroup
from dpmed.fets.server import Server, ServerConfig
from dpmed.privacy.mechanisms import analytic_sigma


def rows(updates: np.ndarray) -> RoundTensors:
    """Flattened updates (n, d) as one tensor named "" with origin 0."""
    return RoundTensors({"": TensorGroup.of(list(updates))})


def dp_fedavg(updates: RoundTensors, clip_norm: float, sigma: float, rng) -> dict:
    """DP-FedAvg (McMahan et al. 2018): the sound release of FedAvg, whose whole-model weighing
    is the uniform mean whatever the data sizes."""
    return agg.sound_release(rules.RULES["fedavg"], updates, np.ones(updates.n), clip_norm,
                             sigma, rng)[0]  # fmt: skip


def test_clip_factors_follow_algorithm_3():
    rows = np.array([[3.0, 4.0], [0.3, 0.4]])  # norms 5 and 0.5
    factors, norms = agg.clip_factors(TensorGroup.of(list(rows)).sq_norms, 2.5)
    assert np.allclose(norms, [5.0, 0.5]) and np.allclose(factors, [0.5, 1.0])


def test_paper_mode_leaves_scalars_unclipped():
    t = [np.asarray(1e6), np.asarray(3e6)]
    out, info = agg.paper_release(rules.RULES["simagg"], t, [0.5, 0.5], "scale.weight", 1.0,
                                  1.0, 1e-5, _Zero())  # fmt: skip
    d = np.array([1e6, 1e6])  # both at distance 1e6 from the mean 2e6: equal α
    assert d.sum() / (1e-8 + d[0]) > 0 and out == pytest.approx(2e6)
    assert info.delta_f == pytest.approx(0.5 * (1e6 - 1.0))


class _Zero:
    """A noise generator drawing zeros (the aggregate without noise)."""

    def standard_normal(self, size, dtype=np.float64):
        return np.zeros(size, dtype=dtype)


def test_paper_mode_equals_hand_computation_of_algorithm_1():
    c, eps0, delta0 = 5.0, 2.0, 1e-5
    t = [np.array([3.0, 4.0, 0.0]), np.array([0.0, 12.0, 5.0]), np.array([1.0, 0.0, 0.0])]
    w = [0.5, 0.3, 0.2]
    # Algorithm 3 by hand: norms 5 (kept), 13 (scaled by 5/13), 1 (kept).
    tc = [t[0], t[1] * (5.0 / 13.0), t[2]]
    mean = (tc[0] + tc[1] + tc[2]) / 3.0
    d = [math.sqrt(sum((mean[j] - x[j]) ** 2 for j in range(3))) for x in tc]
    s = [sum(d) / (1e-8 + di) for di in d]
    w_hat = [wi + si for wi, si in zip(w, s, strict=True)]
    alpha = [wh / (1e-8 + sum(w_hat)) for wh in w_hat]
    pm = sum(a * x for a, x in zip(alpha, tc, strict=True))
    pm_prime = alpha[0] * np.full(3, c) + alpha[1] * tc[1] + alpha[2] * tc[2]
    delta_f = math.sqrt(sum((pm[j] - pm_prime[j]) ** 2 for j in range(3)))
    sigma = delta_f * math.sqrt(2 * math.log(1.25 / delta0)) / eps0
    noise = np.random.default_rng(7).standard_normal(3) * sigma
    out, info = agg.paper_release(
        rules.RULES["simagg"], t, w, "conv.weight", c, eps0, delta0, np.random.default_rng(7)
    )
    assert info.branch == "weight"
    assert info.delta_f == pytest.approx(delta_f, rel=1e-12)
    assert info.sigma == pytest.approx(sigma, rel=1e-12)
    assert np.allclose(out, pm + noise, rtol=1e-12, atol=1e-12)


def test_paper_mode_non_weight_branch():
    t = [np.array([1.0, 2.0]), np.array([3.0, 6.0])]
    w = [0.25, 0.75]
    out, info = agg.paper_release(rules.RULES["simagg"], t, w, "step_count", 10.0, 1.0, 1e-5,
                                  np.random.default_rng(0))  # fmt: skip
    sigma = 10.0 * math.sqrt(2 * math.log(1.25 / 1e-5))
    expected = np.array([2.5, 5.0]) + np.random.default_rng(0).standard_normal(2) * sigma
    assert info.branch == "other" and info.delta_f == 10.0
    assert np.allclose(out, expected)


def _plain(aggregator: str, t: list, w: list, name: str, distance: str = "l2") -> np.ndarray:
    """The server's non-private aggregate of one tensor `name` with local values `t`."""
    cfg = ServerConfig(aggregator, "none", None, 1e-5, 1.0, distance, "analytic", 0)
    local = [(str(i), {name: x}, wi) for i, (x, wi) in enumerate(zip(t, w, strict=True))]
    return Server(cfg).aggregate({name: np.zeros_like(t[0])}, local, 1)[0][name]


def test_simagg_l2_and_sum_diff_by_hand():
    t = [np.array([0.0, 0.0]), np.array([2.0, 0.0]), np.array([0.0, 4.0])]
    w = [0.2, 0.3, 0.5]
    mean = np.array([2.0 / 3.0, 4.0 / 3.0])
    d = np.array([np.linalg.norm(mean - x) for x in t])
    s = d.sum() / (1e-8 + d)
    alpha = (np.array(w) + s) / (1e-8 + (np.array(w) + s).sum())
    assert np.allclose(
        _plain("simagg", t, w, "w.weight"), sum(a * x for a, x in zip(alpha, t, strict=True))
    )
    d2 = np.abs(mean.sum() - np.array([x.sum() for x in t]))
    s2 = d2.sum() / (1e-8 + d2)
    s2 = s2 / s2.sum()
    alpha2 = (np.array(w) + s2) / (1e-8 + (np.array(w) + s2).sum())
    got = _plain("simagg", t, w, "w.bias", distance="sum_diff")
    assert np.allclose(got, sum(a * x for a, x in zip(alpha2, t, strict=True)))
    mean_w = sum(wi * x for wi, x in zip(w, t, strict=True))
    assert np.allclose(_plain("simagg", t, w, "running"), mean_w)
    assert np.allclose(_plain("fedavg", t, w, "w.weight"), mean_w)


def _ball(draw_array: np.ndarray, c: float) -> np.ndarray:
    norm = np.linalg.norm(draw_array)
    return draw_array if norm <= c else draw_array * (c / norm)


vectors = arrays(np.float64, (4, 6), elements=st.floats(-50, 50))


@settings(max_examples=200, deadline=None)
@given(vectors, arrays(np.float64, 6, elements=st.floats(-50, 50)),
       st.integers(0, 3), st.floats(0.1, 20.0),
       st.lists(st.floats(0.01, 1.0), min_size=4, max_size=4))  # fmt: skip
def test_sound_mode_sensitivity_is_at_most_2c(updates, replacement, k, c, sizes):
    neighbour = updates.copy()
    neighbour[k] = _ball(replacement, c)  # any vector of the C-ball replaces collaborator k
    w = np.array(sizes) / sum(sizes)
    rng = np.random.default_rng(0)
    a, _ = agg.sound_release(rules.RULES["simagg"], rows(updates), w, c, 0.0, rng)
    b, _ = agg.sound_release(rules.RULES["simagg"], rows(neighbour), w, c, 0.0, rng)
    assert np.linalg.norm(a[""] - b[""]) <= 2 * c * (1 + 1e-9)
    fa = dp_fedavg(rows(updates), c, 0.0, rng)[""]
    fb = dp_fedavg(rows(neighbour), c, 0.0, rng)[""]
    delta_f = agg.aggregator_mode("dp_fedavg", "sound").rule.sensitivity(c, 4)
    assert np.linalg.norm(fa - fb) <= delta_f * (1 + 1e-9)


def test_sound_mode_noise_std_matches_calibration():
    cfg = ServerConfig("dp_simagg", "sound", 2.0, 1e-5, 0.5, "l2", "analytic", seed=3)
    server = Server(cfg)
    d = 200_000
    base = {"w.weight": np.zeros(d, dtype=np.float64)}
    local = [(str(i), {"w.weight": np.full(d, 1e-3 * i)}, 1.0) for i in range(3)]
    new, mech = server.aggregate(base, local, fl_round=1)
    sigma = analytic_sigma(2 * 0.5, 2.0, 1e-5)
    assert mech.sigma == pytest.approx(sigma) and mech.delta_f == 1.0 and mech.mechanisms == 1
    updates = rows(np.stack([s["w.weight"] for _, s, _ in local]))
    clean, _ = agg.sound_release(rules.RULES["simagg"], updates, [1 / 3] * 3, 0.5, 0.0, _Zero())
    noise = new["w.weight"] - clean[""]
    assert abs(noise.mean()) < 5 * sigma / math.sqrt(d)
    assert noise.std() == pytest.approx(sigma, rel=0.01)


def test_joint_clipping_acts_on_the_whole_update():
    """One collaborator, update (3, 4 | 0, 12) over two tensors: norm 13 over the whole model,
    clipped to 6.5 it is halved in both tensors."""
    glob = {"a.weight": np.zeros(2), "b.weight": np.ones(2)}
    local = {"a.weight": np.array([3.0, 4.0]), "b.weight": np.array([1.0, 13.0])}
    new = dp_fedavg(RoundTensors.updates(glob, [local]), 6.5, 0.0, _Zero())
    assert np.allclose(new["a.weight"], [1.5, 2.0]) and np.allclose(new["b.weight"], [1.0, 7.0])


def test_flatten_and_non_float_refused():
    state = {
        "a.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b.bias": np.ones(2, np.float32),
    }
    assert np.array_equal(agg.flatten_state(state), np.r_[np.arange(6), 1, 1])
    with pytest.raises(ValueError, match="steps"):
        agg.flatten_state({"steps": np.array([1], dtype=np.int64)})
    with pytest.raises(ValueError, match="steps"):
        RoundTensors.updates({"steps": np.array([1])}, [{"steps": np.array([2])}])


def test_paper_server_counts_one_mechanism_per_tensor():
    cfg = ServerConfig("dp_simagg", "paper", 1.0, 1e-5, 100.0, "l2", "analytic", seed=0)
    base = {"a.weight": np.zeros(4), "a.bias": np.zeros(2), "b.weight": np.zeros(3)}
    local = [(str(i), {k: v + i for k, v in base.items()}, 1.0 + i) for i in range(3)]
    _, mech = Server(cfg).aggregate(base, local, fl_round=2)
    assert mech.mechanisms == 3
    assert mech.noise_multiplier == pytest.approx(math.sqrt(2 * math.log(1.25e5)))
