"""DP-SimAgg as a FeTS 2022 challenge (Task 1) / OpenFL custom aggregation function.

    from dpmed.fets.openfl_adapter import fets_dp_simagg
    aggregation_function = fets_dp_simagg(epsilon0=1.0, delta0=1e-5, clip_norm=100.0,
                                          mode="paper")   # or mode="sound"
    run_challenge_experiment(aggregation_function=aggregation_function, ...)

The returned callable has the challenge's signature `(local_tensors, tensor_db, tensor_name,
fl_round, collaborators_chosen_each_round, collaborator_times_per_round) -> np.ndarray`, where
`local_tensors` items carry `.col_name`, `.tensor` and `.weight`.

By default the noise of every release comes from fresh OS entropy (`secure_generator` in
`dpmed.privacy.mechanisms`), so nobody can regenerate and subtract it. Pass `seed` only to
reproduce a run (tests, simulations): the noise is then a function of (seed, fl_round[,
tensor_name]) and anyone who knows the seed can remove it.

- `mode="paper"`: Algorithm 1 on each tensor as it is called (with a seed, noise seeded by
  (seed, fl_round, tensor_name), so the call order does not matter).
- `mode="sound"`: clipping is joint over the whole-model update, which one per-tensor call
  cannot see. On the first call of a round the adapter reads the round's complete state from
  `tensor_db` (OpenFL `TensorDB.search`): the global model as rows with origin 'aggregator',
  tags ('model',), and each chosen collaborator's trained tensors as rows with origin = the
  collaborator, tags ('trained', collaborator); it aggregates the round once (sound DP-SimAgg,
  Δf = 2C, one mechanism) and answers every tensor of that round from the cache. A site whose
  OpenFL version tags tensors differently passes its own `fetch_round(tensor_db, fl_round,
  collaborators) -> (global: {name: array}, local: {collaborator: {name: array}})`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dpmed.fets import aggregation as agg
from dpmed.fets.aggregation import AGGREGATORS
from dpmed.fets.server import Server, ServerConfig, noise_generator

AggregationFunction = Callable[..., np.ndarray]
RoundFetcher = Callable[[Any, int, Sequence[str]], tuple[dict, dict]]


def openfl_fetch_round(
    tensor_db: Any, fl_round: int, collaborators: Sequence[str]
) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """Global and local tensors of round `fl_round` from an OpenFL TensorDB (see module doc)."""
    frame = tensor_db.search(fl_round=fl_round, tags=("model",), origin="aggregator")
    global_state = {row.tensor_name: np.asarray(row.nparray) for row in frame.itertuples()}
    local = {}
    for col in collaborators:
        rows = tensor_db.search(fl_round=fl_round, tags=("trained", col), origin=col)
        local[col] = {row.tensor_name: np.asarray(row.nparray) for row in rows.itertuples()}
    return global_state, local


class _SoundRound:
    """Per-round cache of the sound aggregate, filled on the round's first tensor call."""

    def __init__(self, server: Server, fetch: RoundFetcher) -> None:
        self.server, self.fetch = server, fetch
        self.round: int | None = None
        self.result: dict[str, np.ndarray] = {}

    def __call__(
        self,
        local_tensors: Sequence[Any],
        tensor_db: Any,
        tensor_name: str,
        fl_round: int,
        collaborators_chosen_each_round: Mapping[int, Sequence[str]] | None = None,
        collaborator_times_per_round: Any = None,
    ) -> np.ndarray:
        if self.round != fl_round or tensor_name not in self.result:
            weights = {t.col_name: float(t.weight) for t in local_tensors}
            chosen = list(weights)
            global_state, local = self.fetch(tensor_db, fl_round, chosen)
            missing = [c for c in chosen if set(local[c]) != set(global_state)]
            if missing:
                raise ValueError(f"round {fl_round}: tensors of {missing} do not match the model")
            triples = [(c, local[c], weights[c]) for c in chosen]
            self.result, _ = self.server.aggregate(global_state, triples, fl_round)
            self.round = fl_round
        return self.result[tensor_name]


def fets_dp_simagg(
    epsilon0: float,
    delta0: float = 1e-5,
    clip_norm: float = 100.0,
    mode: str = "paper",
    calibration: str = "analytic",
    seed: int | None = None,
    distance: str = "l2",
    fetch_round: RoundFetcher = openfl_fetch_round,
) -> AggregationFunction:
    """A FeTS-challenge aggregation function running DP-SimAgg in `mode` paper or sound; noise
    from OS entropy unless `seed` is given (reproducible, not for deployment)."""
    if mode == "paper":

        def dp_simagg_paper(
            local_tensors: Sequence[Any],
            tensor_db: Any,
            tensor_name: str,
            fl_round: int,
            collaborators_chosen_each_round: Any = None,
            collaborator_times_per_round: Any = None,
        ) -> np.ndarray:
            rng = noise_generator(seed, fl_round, tensor_name)
            out, _ = agg.dp_simagg_paper_tensor(
                [np.asarray(t.tensor) for t in local_tensors],
                [float(t.weight) for t in local_tensors],
                tensor_name, clip_norm, epsilon0, delta0, rng,
            )  # fmt: skip
            return out

        return dp_simagg_paper
    if mode == "sound":
        cfg = ServerConfig("dp_simagg", "sound", epsilon0, delta0, clip_norm, distance,
                           calibration, seed)  # fmt: skip
        return _SoundRound(Server(cfg), fetch_round)
    known = ", ".join(AGGREGATORS["dp_simagg"].modes)
    raise ValueError(f"unknown DP-SimAgg mode '{mode}' (known: {known})")
