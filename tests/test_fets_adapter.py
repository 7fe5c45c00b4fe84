"""The FeTS-challenge adapter gives the same tensors as the library aggregators."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpmed.fets import aggregation as agg
from dpmed.fets.openfl_adapter import fets_dp_simagg
from dpmed.fets.server import Server, ServerConfig
from dpmed.seeding import stable_seed


class FakeTensorDB:
    """The part of OpenFL's TensorDB the adapter uses: `search` with exact matches."""

    def __init__(self, rows: list[dict]) -> None:
        self.frame = pd.DataFrame(rows)

    def search(self, tensor_name=None, origin=None, fl_round=None, tags=None) -> pd.DataFrame:
        keep = np.ones(len(self.frame), dtype=bool)
        for column, value in (("tensor_name", tensor_name), ("origin", origin),
                              ("round", fl_round), ("tags", tags)):  # fmt: skip
            if value is not None:
                keep &= self.frame[column].map(lambda v, value=value: v == value).to_numpy()
        return self.frame[keep]


def _round(fl_round: int = 3):
    rng = np.random.default_rng(0)
    names = ["enc.conv.weight", "enc.norm.bias", "head.weight"]
    shapes = [(4, 3), (4,), (2, 4)]
    glob = {n: rng.standard_normal(s) for n, s in zip(names, shapes, strict=True)}
    cols = ["c1", "c2", "c3"]
    local = {
        c: {n: glob[n] + 0.3 * rng.standard_normal(glob[n].shape) for n in names} for c in cols
    }
    weights = {"c1": 0.5, "c2": 0.3, "c3": 0.2}
    rows = [{"tensor_name": n, "origin": "aggregator", "round": fl_round, "tags": ("model",),
             "nparray": glob[n]} for n in names]  # fmt: skip
    rows += [{"tensor_name": n, "origin": c, "round": fl_round, "tags": ("trained", c),
              "nparray": local[c][n]} for c in cols for n in names]  # fmt: skip
    return names, glob, local, weights, FakeTensorDB(rows)


def _local_tensors(name, local, weights):
    return [agg.LocalTensor(c, local[c][name], w) for c, w in weights.items()]


def test_sound_adapter_matches_the_server():
    names, glob, local, weights, db = _round()
    fn = fets_dp_simagg(1.0, 1e-5, clip_norm=0.5, mode="sound", seed=9)
    got = {n: fn(_local_tensors(n, local, weights), db, n, 3, {3: list(weights)}, None)
           for n in reversed(names)}  # fmt: skip
    cfg = ServerConfig("dp_simagg", "sound", 1.0, 1e-5, 0.5, "l2", "analytic", 9)
    want, mech = Server(cfg).aggregate(glob, [(c, local[c], w) for c, w in weights.items()], 3)
    assert mech.delta_f == 1.0
    for n in names:
        assert np.array_equal(got[n], want[n])


def test_paper_adapter_is_algorithm_1_per_tensor():
    names, _, local, weights, db = _round()
    fn = fets_dp_simagg(10.0, 1e-5, clip_norm=100.0, mode="paper", seed=4)
    for n in names:
        got = fn(_local_tensors(n, local, weights), db, n, 3, None, None)
        rng = np.random.default_rng(stable_seed("fets-noise", 4, 3, n))
        tensors, w = [local[c][n] for c in weights], list(weights.values())
        want, _ = agg.dp_simagg_paper_tensor(tensors, w, n, 100.0, 10.0, 1e-5, rng)
        assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="unknown DP-SimAgg mode"):
        fets_dp_simagg(1.0, mode="local")
