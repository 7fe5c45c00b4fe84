"""A malformed collaborator upload (issue 53): a tensor missing, one the model lacks, or one of
another shape (a (1,) tensor would broadcast into the aggregate) is screened by
`dpmed.fets.server.screen_round` as a zero update, logged and counted with the collaborator and
the tensor, in the simulation's server and in the OpenFL adapter; the adapter's round reader
names the collaborator and the tensor of an upload OpenFL itself cannot aggregate (missing or
extra). Expected aggregates come from the independent float64 computation of
test_probe_malformed_rounds, with the noise set to zero."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
from test_probe_malformed_rounds import (
    BAD_COL,
    LOGGER,
    SERVER_MODES,
    UUID,
    _assert_close,
    _call_adapter,
    _cfg,
    _db,
    _expected,
    _quiet,
    _round,
    _screened,
    _Server,
    _triples,
)

from dpmed.fets.openfl_adapter import fets_dp_simagg, openfl_fetch_round

# name → (how collaborator c1's state is changed, the tensor the rejection names)
MALFORMED = {
    "missing": (lambda s: s.pop("head.weight"), "head.weight"),
    "extra": (lambda s: s.update({"extra.bias": np.zeros(3, np.float32)}), "extra.bias"),
    "shape-1": (lambda s: s.update({"head.weight": np.full(1, 500, np.float32)}), "head.weight"),
    "transposed": (lambda s: s.update({"enc.conv.weight": s["enc.conv.weight"].T.copy()}),
                   "enc.conv.weight"),
}  # fmt: skip
SHAPED = ["shape-1", "transposed"]  # what reaches the adapter through OpenFL


def _malformed(kind: str):
    glob, local = _round(np.float32)
    change, tensor = MALFORMED[kind]
    change(local[BAD_COL])
    return glob, local, tensor


def _assert_named(caplog, tensor: str) -> None:
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any(f"'{BAD_COL}'" in m and f"'{tensor}'" in m for m in lines), lines


@pytest.mark.parametrize("kind", list(MALFORMED))
@pytest.mark.parametrize("mode", list(SERVER_MODES))
def test_server_screens_a_malformed_update(mode, kind, caplog):
    aggregator, dpmode = mode.split("/")
    c = SERVER_MODES[mode]
    glob, local, tensor = _malformed(kind)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, mech = _Server(_cfg(aggregator, dpmode, c)).aggregate(glob, _triples(local), 1)
    want = _expected(aggregator, dpmode, c, glob, _screened(glob, local, True))
    assert set(got) == set(glob) and all(got[n].shape == glob[n].shape for n in glob)
    _assert_close(got, want, np.float32)
    ((who, name, _),) = [(r.collaborator, r.tensor, r.reason) for r in mech.rejected]
    assert (who, name) == (BAD_COL, tensor)
    _assert_named(caplog, tensor)


@pytest.mark.parametrize("kind", SHAPED)
@pytest.mark.parametrize("dpmode", ["sound", "paper"])
def test_adapter_screens_a_tensor_of_another_shape(dpmode, kind, monkeypatch, caplog):
    c = SERVER_MODES[f"dp_simagg/{dpmode}"]
    glob, local, tensor = _malformed(kind)
    _quiet(monkeypatch)
    fn = fets_dp_simagg(1.0, 1e-5, clip_norm=c, mode=dpmode, seed=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = _call_adapter(fn, glob, local)
    _assert_close(got, _expected("dp_simagg", dpmode, c, glob, _screened(glob, local, True)),
                  np.float32)  # fmt: skip
    assert fn.records[-1]["rejected"] == 1
    _assert_named(caplog, tensor)


@pytest.mark.parametrize("kind", ["missing", "extra"])
def test_round_reader_names_the_collaborator_and_tensor(kind):
    """OpenFL cannot aggregate a round with a tensor missing or extra: the aggregator stops it
    (openfl_components.FetsAggregator) with this error."""
    glob, local = _round(np.float32)
    db = _db(glob, local)
    rows = db.index[db["tags"] == (BAD_COL, "trained")]
    if kind == "missing":
        tensor, db = db.loc[rows[0], "tensor_name"], db.drop(rows[:1])
    else:
        tensor = "extra.bias"
        db = pd.concat([db, db.loc[rows[:1]].assign(tensor_name=tensor)], ignore_index=True)
    with pytest.raises(ValueError, match=f"collaborator '{BAD_COL}'.*'{tensor}'"):
        openfl_fetch_round(db, 3, ["c1", "c2", "c3"], origin=UUID)
