"""DP-SimAgg as a FeTS 2022 challenge (Task 1) / OpenFL custom aggregation function.

    from dpmed.fets.openfl_adapter import fets_dp_simagg
    aggregation_function = fets_dp_simagg(epsilon0=1.0, delta0=1e-5, clip_norm=100.0,
                                          mode="sound")   # or mode="paper"
    run_challenge_experiment(aggregation_function=aggregation_function, ...)

The challenge wraps it in its privileged `CustomAggregationWrapper`, so OpenFL's
`TensorDB.get_aggregated_tensor` calls it once per trained tensor with `(local_tensors, tensor_db,
tensor_name, fl_round, collaborators_chosen_each_round, collaborator_times_per_round)`:
`tensor_db` is the aggregator's TensorDB table (columns tensor_name, origin, round, report,
tags, nparray) and `local_tensors` items carry `.col_name`, `.tensor` and `.weight`.

On a round's first call it reads the round from that table by exact key
(`openfl_fetch_round`; docs/openfl.md lists the keys OpenFL 1.9 writes), never through
`TensorDB.search`, which falls back to other rounds' rows when nothing matches; a site whose
OpenFL stores rounds differently passes its own `fetch_round(tensor_db, fl_round,
collaborators) -> (global: {name: array}, local: {collaborator: {name: array}})`. Then it
aggregates the whole round once with the simulation's server (`Server.aggregate`: the screen,
the aggregator wrapped by its DP mode, the round's noise stream), so a deployment and a
simulation of the same round release the same function of it, and answers every tensor of the
round from that result.

The noise comes from fresh OS entropy unless `seed` is given (reproducible: anyone who knows
the seed can remove the noise). Each round's privacy record (the simulation's rounds.csv
privacy columns plus mode, ε0, δ0, C and noise source) is kept in `.records` and logged at INFO
on this module's logger.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dpmed.fets.aggregation import DP_MODES, RoundMechanisms, ServerConfig
from dpmed.fets.privacy import round_columns
from dpmed.fets.server import Server
from dpmed.privacy.mechanisms import noise_source

logger = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]
RoundFetcher = Callable[[Any, int, Sequence[str]], tuple[Tensors, dict[str, Tensors]]]

COLUMNS = ("tensor_name", "origin", "round", "report", "tags", "nparray")
MODEL_TAGS = ("model",)
# A collaborator's trained tensor as `Aggregator._process_named_tensor` stores it, before its
# name is added: lossless uploads, with or without delta (the delta is applied and its tag
# removed), and lossy ones.
TRAINED_TAGS = (("trained",), ("lossy_decompressed", "trained"))


def collaborator_tags(tags: Sequence[str], collaborator: str) -> tuple[str, ...]:
    """OpenFL's `change_tags(tags, add_field=collaborator)`: the tag set, sorted."""
    return tuple(sorted({*tags, collaborator}))


def _table(tensor_db: Any) -> pd.DataFrame:
    """The aggregator's TensorDB table: what a privileged wrapper passes, or a TensorDB."""
    frame = getattr(tensor_db, "tensor_db", tensor_db)
    if not isinstance(frame, pd.DataFrame) or not set(COLUMNS) <= set(frame.columns):
        raise TypeError(
            "DP-SimAgg reads each round from the aggregator's TensorDB table (columns "
            f"{', '.join(COLUMNS)}), which OpenFL passes to privileged aggregation functions "
            f"such as the challenge's CustomAggregationWrapper; got {type(tensor_db).__name__}"
        )
    return frame


def _aggregator_origin(rows: pd.DataFrame, fl_round: int) -> str:
    """The aggregator's uuid: the one origin of the round's global-model rows (the aggregator
    stores every tensor it holds, collaborators' uploads included, under its own uuid)."""
    is_model = np.array([tuple(t) == MODEL_TAGS for t in rows["tags"]], dtype=bool)
    origins = sorted({str(o) for o in rows["origin"][is_model]})
    if len(origins) != 1:
        raise ValueError(
            f"round {fl_round}: the global model's rows (tags {MODEL_TAGS}, report False) have "
            f"origins {origins}, expected one, the aggregator's uuid; name it with "
            "fetch_round=functools.partial(openfl_fetch_round, origin=...)"
        )
    return origins[0]


def openfl_fetch_round(
    tensor_db: Any, fl_round: int, collaborators: Sequence[str], origin: str | None = None
) -> tuple[Tensors, dict[str, Tensors]]:
    """Round `fl_round`'s global model and each collaborator's trained tensors, read from an
    OpenFL 1.9 aggregator's TensorDB table by exact key (tensor_name, origin, round, report
    False, tags); `origin` is the aggregator's uuid, by default found from the round's
    global-model rows. Raises unless each key has exactly one row."""
    frame = _table(tensor_db)
    rows = frame[(frame["round"] == fl_round) & ~frame["report"].astype(bool)]
    origin = _aggregator_origin(rows, fl_round) if origin is None else origin
    rows = rows[rows["origin"] == origin]
    found: dict[tuple[str, tuple[str, ...]], list[Any]] = {}
    for name, tags, value in zip(rows["tensor_name"], rows["tags"], rows["nparray"], strict=True):
        found.setdefault((str(name), tuple(tags)), []).append(value)

    def one(name: str, options: Sequence[tuple[str, ...]], who: str) -> np.ndarray:
        hits = [value for tags in options for value in found.get((name, tags), [])]
        if len(hits) != 1:
            keys = " or ".join(f"({name!r}, {origin!r}, {fl_round}, False, {t})" for t in options)
            raise ValueError(f"round {fl_round}: {who}, tensor {name!r}: {len(hits)} rows with "
                             f"key {keys}, expected 1")  # fmt: skip
        return np.asarray(hits[0])

    names = [name for name, tags in found if tags == MODEL_TAGS]
    if not names:
        raise ValueError(f"round {fl_round}: no global model rows with origin {origin!r}")
    global_state = {name: one(name, [MODEL_TAGS], "the global model") for name in names}
    local = {}
    for col in collaborators:
        options = [collaborator_tags(tags, col) for tags in TRAINED_TAGS]
        extra = sorted({name for name, tags in found if tags in options} - set(names))
        if extra:
            raise ValueError(f"round {fl_round}: collaborator {col!r} sent tensors {extra}, not "
                             "in the model")  # fmt: skip
        local[col] = {name: one(name, options, f"collaborator {col!r}") for name in names}
    return global_state, local


class AggregationFunction:
    """A FeTS-challenge aggregation function of one `ServerConfig`: on a round's first call it
    reads and checks the round and aggregates it once with the simulation's server
    (`Server.aggregate`: the screen, the rule wrapped by its DP mode, the round's noise
    stream); every tensor of the round is answered from that result. `records` holds one
    privacy record per round."""

    def __init__(self, cfg: ServerConfig, fetch: RoundFetcher, first_round: int = 0) -> None:
        self.cfg, self.fetch, self.first_round = cfg, fetch, first_round
        self.round: int | None = None
        self.weights: dict[str, float] = {}
        self.global_state: Tensors = {}
        self.local: dict[str, Tensors] = {}
        self.result: Tensors = {}
        self.records: list[dict[str, Any]] = []

    def __call__(
        self,
        local_tensors: Sequence[Any],
        tensor_db: Any,
        tensor_name: str,
        fl_round: int,
        collaborators_chosen_each_round: Any = None,
        collaborator_times_per_round: Any = None,
    ) -> np.ndarray:
        weights = {t.col_name: float(t.weight) for t in local_tensors}
        if self.round != fl_round:
            self.round = None  # until the new round is read, checked and aggregated
            self.global_state, self.local = self.fetch(tensor_db, fl_round, list(weights))
            self.weights = weights
            self._check(local_tensors, weights, tensor_name, fl_round)
            triples = [(c, self.local[c], w) for c, w in weights.items()]
            self.result, mech = Server(self.cfg).aggregate(
                self.global_state, triples, fl_round + self.first_round
            )
            if mech is not None:
                self._record(fl_round, mech)
            self.round = fl_round
        else:
            self._check(local_tensors, weights, tensor_name, fl_round)
        return self.result[tensor_name]

    def _check(
        self, local_tensors: Sequence[Any], weights: dict, tensor_name: str, fl_round: int
    ) -> None:
        """What OpenFL passed must be what was read: same collaborators, weights and values."""
        if weights != self.weights:
            raise ValueError(f"round {fl_round}: collaborators/weights {weights} != {self.weights}")
        if tensor_name not in self.global_state:
            raise ValueError(f"round {fl_round}: {tensor_name!r} is not in the global model")
        for t in local_tensors:
            read = self.local[t.col_name][tensor_name]
            if not np.array_equal(np.asarray(t.tensor), read, equal_nan=True):
                raise ValueError(
                    f"round {fl_round}: {t.col_name!r}'s {tensor_name!r} in tensor_db is not "
                    "the tensor OpenFL passed"
                )

    def _record(self, fl_round: int, mech: RoundMechanisms) -> None:
        """Keeps and logs the round's privacy record."""
        cfg = self.cfg
        record = {
            "round": int(fl_round),
            "mode": cfg.dpmode,
            "guarantee": DP_MODES[cfg.dpmode].guarantee,
            "epsilon0": cfg.epsilon0,
            "delta0": cfg.delta0,
            "clip_norm": cfg.clip_norm,
            "collaborators": len(self.weights),
            "noise_source": noise_source(cfg.seed),
            **round_columns(cfg, fl_round + 1, mech),  # OpenFL counts rounds from 0
        }
        if not DP_MODES[cfg.dpmode].per_tensor:
            record["calibration"] = cfg.sound_calibration
        self.records.append(record)
        logger.info("%s round record: %s", cfg.mode.label, json.dumps(record, default=float))


def fets_dp_simagg(
    epsilon0: float,
    delta0: float = 1e-5,
    clip_norm: float = 100.0,
    mode: str = "paper",
    calibration: str = "analytic",
    seed: int | None = None,
    distance: str = "l2",
    fetch_round: RoundFetcher = openfl_fetch_round,
    first_round: int = 0,
    aggregator: str = "dp_simagg",
) -> AggregationFunction:
    """A FeTS-challenge aggregation function running the private `aggregator` (DP-SimAgg by
    default, or DP-FedAvg) in DP `mode` (paper or sound for DP-SimAgg) as the simulation's
    server does; noise from OS entropy unless `seed` is given (reproducible, not for
    deployment). `first_round` is the number the server gives OpenFL's round 0 in the seeded
    noise stream and the screen's messages: 1 numbers rounds as `dpmed.fets.run` does, so a
    seeded federation draws the simulation's noise. An aggregator without `mode` raises,
    naming both (`ServerConfig`)."""
    cfg = ServerConfig(aggregator, mode, float(epsilon0), float(delta0), float(clip_norm),
                       distance, calibration, seed)  # fmt: skip
    return AggregationFunction(cfg, fetch_round, first_round)
