"""The FeTS-challenge adapter gives the same tensors as the library aggregators, reads each
round from an OpenFL TensorDB by exact key and refuses tables it cannot read unambiguously.

The tables here are real `openfl.databases.TensorDB`s filled with the keys OpenFL 1.9's
aggregator writes (tests/test_openfl_adapter.py checks those keys against the real aggregator).
"""

from __future__ import annotations

import functools
import json
import logging

import numpy as np
import pytest
from openfl.databases import TensorDB
from openfl.utilities import TensorKey, change_tags

from dpmed.fets import aggregation as agg
from dpmed.fets import aggregators as rules
from dpmed.fets.openfl_adapter import (
    TRAINED_TAGS,
    collaborator_tags,
    fets_dp_simagg,
    openfl_fetch_round,
)
from dpmed.fets.privacy import round_columns
from dpmed.fets.server import Server, ServerConfig
from dpmed.privacy.mechanisms import NOISE_SEEDED
from dpmed.privacy.normals import NormalSource
from dpmed.seeding import stable_seed

UUID = "aggregator_fets_1a2b3c4d"


def _states(rng, names, shapes, cols, spread):
    glob = {n: rng.standard_normal(s) for n, s in zip(names, shapes, strict=True)}
    local = {c: {n: glob[n] + spread * rng.standard_normal(glob[n].shape) for n in names}
             for c in cols}  # fmt: skip
    return glob, local


def _round(fl_round: int = 3):
    """Round `fl_round` of three chosen collaborators in the aggregator's TensorDB table, beside
    the previous round (other values), a collaborator not chosen this round and a metric."""
    rng = np.random.default_rng(0)
    names = ["enc.conv.weight", "enc.norm.bias", "head.weight"]
    shapes = [(4, 3), (4,), (2, 4)]
    cols = ["c1", "c2", "c3"]
    weights = {"c1": 0.5, "c2": 0.3, "c3": 0.2}
    db = TensorDB()
    for r in (fl_round - 1, fl_round):
        glob, local = _states(rng, names, shapes, [*cols, "c4"], 0.3 + r)
        db.cache_tensor({TensorKey(n, UUID, r, False, ("model",)): glob[n] for n in names})
        for c in cols if r == fl_round else [*cols, "c4"]:
            tags = change_tags(("trained",), add_field=c)
            db.cache_tensor({TensorKey(n, UUID, r, False, tags): local[c][n] for n in names})
        db.cache_tensor({TensorKey("dice", UUID, r, True, ("c1", "metric")): np.array(0.5)})
    return names, glob, local, weights, db.tensor_db


def _local_tensors(name, local, weights):
    return [rules.LocalTensor(c, local[c][name], w) for c, w in weights.items()]


@pytest.mark.parametrize("aggregator", ["dp_simagg", "dp_fedavg"])
def test_sound_adapter_matches_the_server(aggregator):
    """Any private aggregator, not only DP-SimAgg: the adapter releases what the simulation's
    server releases for the round (Δf = 2C for DP-SimAgg, 2C/m for DP-FedAvg)."""
    names, glob, local, weights, db = _round()
    fn = fets_dp_simagg(1.0, 1e-5, clip_norm=0.5, mode="sound", seed=9, aggregator=aggregator)
    got = {n: fn(_local_tensors(n, local, weights), db, n, 3, {3: list(weights)}, None)
           for n in reversed(names)}  # fmt: skip
    cfg = ServerConfig(aggregator, "sound", 1.0, 1e-5, 0.5, "l2", "analytic", 9)
    want, mech = Server(cfg).aggregate(glob, [(c, local[c], w) for c, w in weights.items()], 3)
    assert mech.delta_f == (1.0 if aggregator == "dp_simagg" else 1.0 / 3)
    for n in names:
        assert np.array_equal(got[n], want[n])
    record = {**round_columns(cfg, 4, mech), "mode": "sound", "calibration": "analytic"}
    assert fn.records == [{"round": 3, "guarantee": "dp", "epsilon0": 1.0, "delta0": 1e-5,
                           "clip_norm": 0.5, "collaborators": 3, "noise_source": NOISE_SEEDED,
                           **record}]  # fmt: skip


def test_paper_adapter_is_algorithm_1_per_tensor(caplog):
    names, _, local, weights, db = _round()
    fn = fets_dp_simagg(10.0, 1e-5, clip_norm=100.0, mode="paper", seed=4)
    infos = []
    rng = NormalSource(stable_seed("fets-noise", 4, 3, bits=64))  # the round's one stream
    with caplog.at_level(logging.INFO, logger="dpmed.fets.openfl_adapter"):
        for n in names:  # the global model's order
            got = fn(_local_tensors(n, local, weights), db, n, 3, None, None)
            tensors, w = [local[c][n] for c in weights], list(weights.values())
            want, info = agg.paper_release(rules.RULES["simagg"], tensors, w, n, 100.0, 10.0,
                                           1e-5, rng)  # fmt: skip
            infos.append(info)
            assert np.array_equal(got, want)
    [record] = fn.records
    assert record["mechanisms"] == 3 and record["guarantee"] == "paper-approximation"
    assert record["delta_f"] == max(i.delta_f for i in infos)
    assert record["eps_basic_cum"] == 4 * 10.0  # rounds 0..3
    logged = [json.loads(r.getMessage().split(": ", 1)[1]) for r in caplog.records]
    assert logged == [record]  # one record per round
    with pytest.raises(ValueError, match="'dp_simagg' has no DP mode 'local'"):
        fets_dp_simagg(1.0, mode="local")
    with pytest.raises(ValueError, match="'dp_fedavg' has no DP mode 'paper'"):
        fets_dp_simagg(1.0, mode="paper", aggregator="dp_fedavg")
    with pytest.raises(ValueError, match="'fedavg' has no DP mode 'sound'"):
        fets_dp_simagg(1.0, mode="sound", aggregator="fedavg")


@pytest.mark.parametrize("col", ["1", "c1", "ucl", "zz"])
def test_collaborator_tags_are_openfls(col):
    for tags in TRAINED_TAGS:
        assert collaborator_tags(tags, col) == change_tags(tags, add_field=col)


def test_fetch_reads_the_round_by_exact_key():
    names, glob, local, weights, db = _round()
    got_glob, got_local = openfl_fetch_round(db, 3, list(weights))
    assert got_glob.keys() == glob.keys() and got_local.keys() == weights.keys()
    for n in names:
        assert got_glob[n] is glob[n]
        assert all(got_local[c][n] is local[c][n] for c in weights)
    pinned = functools.partial(openfl_fetch_round, origin=UUID)
    assert pinned(db, 3, ["c1"])[1]["c1"]["head.weight"] is local["c1"]["head.weight"]
    with pytest.raises(ValueError, match=r"0 rows with key \('enc.conv.weight', "):
        openfl_fetch_round(db, 3, ["c4"])  # c4 trained in round 2 only
    with pytest.raises(ValueError, match="no global model rows"):
        openfl_fetch_round(db, 3, ["c1"], origin="aggregator")


@pytest.mark.parametrize("mode", ["paper", "sound"])
def test_ambiguous_or_missing_rows_raise(mode):
    names, glob, local, weights, db = _round()

    def call(table, local_tensors=None, name=names[0]):
        fn = fets_dp_simagg(1.0, 1e-5, clip_norm=0.5, mode=mode, seed=1)
        return fn(local_tensors or _local_tensors(name, local, weights), table, name, 3, None, None)

    head = db[(db["tensor_name"] == names[2]) & (db["round"] == 3)]
    twice = TensorDB()
    twice.tensor_db = db.copy()
    twice.cache_tensor(
        {TensorKey(names[2], UUID, 3, False, ("c2", "trained")): local["c2"][names[2]]}
    )
    with pytest.raises(ValueError, match=r"2 rows with key \('head.weight'"):
        call(twice)  # a TensorDB object works as well as its table
    missing = db.drop(head[head["tags"] == ("c3", "trained")].index)
    with pytest.raises(ValueError, match=r"0 rows with key \('head.weight'.*'c3', 'trained'"):
        call(missing)
    other = db.copy()
    other.loc[len(other)] = ["extra", "aggregator", 3, False, ("model",), np.zeros(1)]
    with pytest.raises(ValueError, match="origins"):
        call(other)
    wrong = _local_tensors(names[0], {c: {names[0]: local[c][names[0]] + 1} for c in weights},
                           weights)  # fmt: skip
    with pytest.raises(ValueError, match="is not the tensor OpenFL passed"):
        call(db, wrong)
    with pytest.raises(ValueError, match="not in the global model"):
        call(db, _local_tensors(names[0], local, weights), name="dice")
    with pytest.raises(TypeError, match="TensorDB table"):
        call(iter(db.iterrows()))  # a non-privileged wrapper's db_iterator
