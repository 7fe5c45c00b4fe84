"""Malformed aggregation rounds (issue 44): one bad collaborator cannot poison a released
model, and degenerate rounds raise naming the value.

Policy under test (docs/privacy.md, "One bad collaborator"): the server's screen
(`dpmed.fets.server.screen_round`, shared by `Server` and the OpenFL adapter) rejects an update
with a non-finite entry or a norm beyond `MAX_UPDATE_NORM`, logs the collaborator and the
tensor, counts it in the round's record and aggregates it as a zero update (the collaborator
keeps its weight and its place in the count m); a finite update within the limit, however
large, is clipped. Expected aggregates are computed here independently, in float64, on the
flattened tensors, with the noise set to zero.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from openfl.databases import TensorDB
from openfl.utilities import TensorKey, change_tags

from dpmed.fets import aggregation as agg
from dpmed.fets import aggregators as rules
from dpmed.fets import privacy as fets_privacy
from dpmed.fets import round_tensors as rt
from dpmed.fets import server as srv
from dpmed.fets.openfl_adapter import fets_dp_simagg
from dpmed.fets.server import Server, ServerConfig

UUID = "aggregator_fets_probe"
SHAPES = {"enc.conv.weight": (4, 3), "enc.norm.bias": (4,), "head.weight": (2, 4)}
COLS = ("c1", "c2", "c3")
WEIGHTS = (0.5, 0.3, 0.2)
BAD_COL, BAD_TENSOR, BAD_AT = "c1", "head.weight", (1, 2)  # collaborator 0: the basis origin
# name → (entry written into one collaborator's tensor, the tensors' dtype, rejected?)
BAD = {
    "nan": (math.nan, np.float32, True),
    "+inf": (math.inf, np.float32, True),
    "-inf": (-math.inf, np.float32, True),
    "1e30": (1e30, np.float32, False),  # float32 squares overflow; clipped in float64
    "1e300": (1e300, np.float64, True),  # its square overflows float64: beyond the limit
}
SERVER_MODES = {  # aggregator/dpmode → clip norm C
    "dp_simagg/sound": 0.5,
    "dp_fedavg/sound": 0.5,
    "dp_simagg/paper": 2.0,
}
LOGGER = "dpmed.fets.server"


class _Const:
    """A noise generator drawing one constant (0: the aggregate without noise; NaN: broken)."""

    def __init__(self, value: float = 0.0) -> None:
        self.value = value

    def standard_normal(self, size, dtype=np.float64):
        return np.full(size, self.value, dtype=dtype)


class _Server(Server):
    """`Server` with a constant noise draw."""

    def __init__(self, cfg: ServerConfig, noise: float = 0.0) -> None:
        super().__init__(cfg)
        self.noise = noise

    def generator(self, fl_round):
        return _Const(self.noise)


def _cfg(aggregator: str, dpmode: str, clip_norm: float, eps0: float | None = 1.0):
    return ServerConfig(aggregator, dpmode, eps0, 1e-5, clip_norm, "l2", "analytic", seed=0)


def _round(dtype=np.float32, bad: float | None = None, seed: int = 0):
    """A global model and three collaborators' states (updates ~0.3 per entry); with `bad`,
    one entry of collaborator c1's head.weight set to it."""
    rng = np.random.default_rng(seed)
    glob = {n: rng.standard_normal(s).astype(dtype) for n, s in SHAPES.items()}
    local = {c: {n: (v + 0.3 * rng.standard_normal(v.shape)).astype(dtype)
                 for n, v in glob.items()} for c in COLS}  # fmt: skip
    if bad is not None:
        local[BAD_COL][BAD_TENSOR][BAD_AT] = bad
    return glob, local


def _triples(local):
    return [(c, local[c], w) for c, w in zip(COLS, WEIGHTS, strict=True)]


# --- independent float64 computations ------------------------------------------------------


def _flat(state) -> np.ndarray:
    return np.concatenate([np.asarray(state[n], np.float64).ravel() for n in SHAPES])


def _unflat(flat: np.ndarray) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for name, shape in SHAPES.items():
        size = int(np.prod(shape))
        out[name] = flat[at : at + size].reshape(shape)
        at += size
    return out


def _clip(x: np.ndarray, c: float) -> np.ndarray:
    norm = np.linalg.norm(x)
    return x if norm <= c else x * (c / norm)


def _simagg_alpha(ys: list[np.ndarray], weights) -> np.ndarray:
    mean = sum(ys) / len(ys)
    d = np.array([np.linalg.norm(mean - y) for y in ys])
    s = d.sum() / (1e-8 + d)
    w_hat = np.asarray(weights) + s
    return w_hat / (1e-8 + w_hat.sum())


def _expected(aggregator: str, dpmode: str, c: float, glob, states) -> dict[str, np.ndarray]:
    """The noiseless aggregate of `states` (rejected ones already replaced by `glob`)."""
    w = np.asarray(WEIGHTS) / sum(WEIGHTS)
    if dpmode == "sound":  # joint clipping of the whole-model updates
        o = _flat(glob)
        ys = [_clip(_flat(s) - o, c) for s in states]
        if aggregator == "dp_fedavg":
            return _unflat(o + sum(ys) / len(ys))
        alpha = _simagg_alpha(ys, w)
        return _unflat(o + sum(a * y for a, y in zip(alpha, ys, strict=True)))
    out = {}
    for name in SHAPES:  # paper mode: every tensor here is a weight or a bias, clipped alone
        xs = [np.asarray(s[name], np.float64) for s in states]
        if dpmode == "paper":
            xs = [_clip(x, c) for x in xs]
        alpha = _simagg_alpha(xs, w) if aggregator != "fedavg" else w
        out[name] = sum(a * x for a, x in zip(alpha, xs, strict=True))
    return out


def _screened(glob, local, rejected: bool):
    return [glob if (rejected and c == BAD_COL) else local[c] for c in COLS]


def _assert_close(got, want, dtype):
    tol = 1e-5 if dtype == np.float32 else 1e-9
    for name in SHAPES:
        assert np.all(np.isfinite(got[name])), name
        assert np.allclose(got[name], want[name], rtol=tol, atol=tol), name


def _assert_logged(caplog):
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any(f"'{BAD_COL}'" in m and f"'{BAD_TENSOR}'" in m for m in lines), lines


# --- one bad collaborator through the server -----------------------------------------------


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("mode", list(SERVER_MODES))
def test_server_one_bad_collaborator(mode, bad, caplog):
    """NaN, ±inf and 1e300 are rejected (zero update, logged, counted); 1e30 is clipped. The
    aggregate is finite and equals the float64 computation either way."""
    aggregator, dpmode = mode.split("/")
    c = SERVER_MODES[mode]
    value, dtype, rejected = BAD[bad]
    glob, local = _round(dtype, value)
    cfg = _cfg(aggregator, dpmode, c)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, mech = _Server(cfg).aggregate(glob, _triples(local), 1)
    want = _expected(aggregator, dpmode, c, glob, _screened(glob, local, rejected))
    _assert_close(got, want, dtype)
    assert len(mech.rejected) == int(rejected)
    assert fets_privacy.round_columns(cfg, 1, mech)["rejected"] == int(rejected)
    if rejected:
        (r,) = mech.rejected
        assert (r.collaborator, r.tensor) == (BAD_COL, BAD_TENSOR)
        _assert_logged(caplog)
    if dpmode == "sound":  # σ is calibrated for all m = 3 chosen collaborators
        assert mech.delta_f == cfg.mode.rule.sensitivity(c, 3)


@pytest.mark.parametrize("aggregator", ["fedavg", "simagg"])
def test_server_non_private_rejects_a_nan_update(aggregator, caplog):
    glob, local = _round(np.float32, math.nan)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, mech = Server(_cfg(aggregator, "none", 1.0, None)).aggregate(glob, _triples(local), 1)
    assert mech is None
    _assert_close(got, _expected(aggregator, "none", 1.0, glob, _screened(glob, local, True)),
                  np.float32)  # fmt: skip
    _assert_logged(caplog)


def test_privacy_json_counts_rejected_updates():
    glob, local = _round(np.float32, math.nan)
    cfg = _cfg("dp_simagg", "sound", 0.5)
    _, mech = _Server(cfg).aggregate(glob, _triples(local), 1)
    record = fets_privacy.privacy_record(cfg, 1, fets_privacy.round_columns(cfg, 1, mech), 1)
    assert record.guarantee == "dp" and record.extra["rejected_updates"] == 1
    assert any("rejected" in text for text in record.not_covered)


# --- the aggregation functions refuse what they cannot clip --------------------------------


def _rows(value: float) -> rt.RoundTensors:
    updates = np.random.default_rng(1).standard_normal((3, 8))
    updates[1, 4] = value
    return rt.RoundTensors({"": rt.TensorGroup.of(list(updates))})


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("rule", ["dp_simagg_sound", "dp_fedavg", "dp_simagg_paper"])
def test_aggregation_functions_refuse_an_unclippable_update(rule, value):
    """Called without the server's screen, a rule raises instead of passing the update
    unclipped into a NaN aggregate."""
    with pytest.raises(ValueError, match="update 1 has norm"):
        if rule == "dp_simagg_sound":
            agg.sound_release(rules.RULES["simagg"], _rows(value), [1 / 3] * 3, 1.0, 0.0, _Const())
        elif rule == "dp_fedavg":
            agg.sound_release(rules.RULES["fedavg"], _rows(value), [1.0] * 3, 1.0, 0.0, _Const())
        else:
            tensors = np.random.default_rng(1).standard_normal((3, 8))
            tensors[1, 4] = value
            agg.paper_release(rules.RULES["simagg"], list(tensors), [1 / 3] * 3, "w.weight",
                              1.0, 1.0, 1e-5, _Const())  # fmt: skip


@pytest.mark.parametrize("value", [math.nan, 1e30], ids=["nan", "1e30"])
def test_norms_are_float64_and_keep_non_finite_values(value):
    x = np.ones(2048, np.float32)
    x[7] = value
    sq = rt.TensorGroup.of([x, np.ones(2048, np.float32)]).sq_norms
    assert sq.dtype == np.float64 and sq[1] == 2048.0
    assert np.isnan(sq[0]) if math.isnan(value) else sq[0] == pytest.approx(1e60 + 2047)


# --- one bad collaborator through the OpenFL adapter ---------------------------------------


def _db(glob, local, fl_round: int = 3):
    db = TensorDB()
    db.cache_tensor({TensorKey(n, UUID, fl_round, False, ("model",)): v for n, v in glob.items()})
    for c in COLS:
        tags = change_tags(("trained",), add_field=c)
        db.cache_tensor({TensorKey(n, UUID, fl_round, False, tags): local[c][n] for n in SHAPES})
    return db.tensor_db


def _call_adapter(fn, glob, local, cols=COLS, fl_round: int = 3):
    db = _db(glob, local, fl_round)
    out = {}
    for name in SHAPES:
        tensors = [rules.LocalTensor(c, local[c][name], w)
                   for c, w in zip(COLS, WEIGHTS, strict=True) if c in cols]  # fmt: skip
        out[name] = fn(tensors, db, name, fl_round, None, None)
    return out


def _quiet(monkeypatch, value: float = 0.0):
    """The server's noise generator (the adapter's too: it aggregates with the server) draws
    `value`."""
    monkeypatch.setattr(srv, "noise_generator", lambda *a, **k: _Const(value))


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("dpmode", ["sound", "paper"])
def test_adapter_one_bad_collaborator(dpmode, bad, monkeypatch, caplog):
    value, dtype, rejected = BAD[bad]
    c = SERVER_MODES[f"dp_simagg/{dpmode}"]
    glob, local = _round(dtype, value)
    _quiet(monkeypatch)
    fn = fets_dp_simagg(1.0, 1e-5, clip_norm=c, mode=dpmode, seed=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = _call_adapter(fn, glob, local)
    want = _expected("dp_simagg", dpmode, c, glob, _screened(glob, local, rejected))
    _assert_close(got, want, dtype)
    assert fn.records[-1]["rejected"] == int(rejected)
    if rejected:
        _assert_logged(caplog)


# --- degenerate rounds raise, naming the value ---------------------------------------------


@pytest.mark.parametrize("mode", ["dp_simagg/sound", "dp_simagg/paper", "adapter/sound"])
def test_zero_collaborators_raise(mode):
    glob, local = _round()
    with pytest.raises(ValueError, match="0 collaborators"):
        if mode == "adapter/sound":
            _call_adapter(fets_dp_simagg(1.0, mode="sound", seed=0), glob, local, cols=())
        else:
            Server(_cfg(*mode.split("/"), 1.0)).aggregate(glob, [], 1)


@pytest.mark.parametrize("weights", [(0.0, 0.0, 0.0), (0.5, -0.1, 0.6), (0.5, math.nan, 0.5)],
                         ids=["all-zero", "negative", "nan"])  # fmt: skip
@pytest.mark.parametrize("dpmode", ["sound", "paper"])
def test_bad_weights_raise_naming_them(dpmode, weights):
    glob, local = _round()
    triples = [(c, local[c], w) for c, w in zip(COLS, weights, strict=True)]
    with pytest.raises(ValueError, match=r"weights must be finite.*\[0\.") as err:
        Server(_cfg("dp_simagg", dpmode, 1.0)).aggregate(glob, triples, 1)
    assert str(weights[1]) in str(err.value)


@pytest.mark.parametrize("clip_norm", [0.0, -1.0], ids=["zero", "negative"])
@pytest.mark.parametrize("mode", ["dp_simagg/sound", "dp_fedavg/sound", "dp_simagg/paper"])
def test_clip_norm_must_be_positive(mode, clip_norm):
    glob, local = _round()
    with pytest.raises(ValueError, match=f"clip_norm must be finite and > 0, got {clip_norm}"):
        Server(_cfg(*mode.split("/"), clip_norm)).aggregate(glob, _triples(local), 1)


@pytest.mark.parametrize("clip_norm", [0.0, -1.0], ids=["zero", "negative"])
def test_adapter_clip_norm_must_be_positive(clip_norm):
    with pytest.raises(ValueError, match=f"clip_norm must be finite and > 0, got {clip_norm}"):
        glob, local = _round()
        _call_adapter(fets_dp_simagg(1.0, clip_norm=clip_norm, mode="paper", seed=0), glob,
                      local)  # fmt: skip


@pytest.mark.parametrize("clip_norm", [0.0, -1.0], ids=["zero", "negative"])
def test_paper_tensor_clip_norm_must_be_positive(clip_norm):
    t = [np.array([1.0, 2.0]), np.array([3.0, 6.0])]
    with pytest.raises(ValueError, match="clip_norm must be finite and > 0"):
        agg.paper_release(
            rules.RULES["simagg"], t, [0.5, 0.5], "step_count", clip_norm, 1.0, 1e-5, _Const()
        )


# --- a non-finite global model is never used or released -----------------------------------


@pytest.mark.parametrize("mode", ["dp_simagg/sound", "dp_simagg/paper"])
def test_non_finite_global_model_is_refused(mode):
    glob, local = _round()
    glob["enc.norm.bias"][2] = math.nan
    with pytest.raises(ValueError, match="global model: tensor 'enc.norm.bias' has non-finite"):
        Server(_cfg(*mode.split("/"), 1.0)).aggregate(glob, _triples(local), 1)


@pytest.mark.parametrize("mode", ["dp_simagg/sound", "dp_fedavg/sound", "dp_simagg/paper"])
def test_non_finite_aggregate_is_not_released(mode):
    """A noise source gone wrong (NaN draws) leaves a NaN aggregate: it is refused."""
    glob, local = _round()
    with pytest.raises(ValueError, match="aggregate: tensor 'enc.conv.weight' has non-finite"):
        _Server(_cfg(*mode.split("/"), 1.0), noise=math.nan).aggregate(glob, _triples(local), 1)


@pytest.mark.parametrize("dpmode", ["sound", "paper"])
def test_adapter_refuses_a_non_finite_aggregate(dpmode, monkeypatch):
    glob, local = _round()
    _quiet(monkeypatch, math.nan)
    fn = fets_dp_simagg(1.0, clip_norm=1.0, mode=dpmode, seed=0)
    with pytest.raises(ValueError, match="aggregate: tensor 'enc.conv.weight' has non-finite"):
        _call_adapter(fn, glob, local)
