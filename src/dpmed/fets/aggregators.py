"""The fets aggregation rules (paper 000, Algorithm 1 lines 10–18, and FedAvg) and their
registry `RULES`, whatever the DP mode.

A rule says how a round's tensors are weighed: its `weigh` gives the weights α of the n
(clipped) vectors c_i v_i of one tensor or of the whole-model update (`Clipped`), from their
Gram matrix when it weighs by similarity. The DP modes of `dpmed.fets.aggregation` wrap any
rule they accept, as Flower's DP strategies wrap any strategy: mode `none` combines the
unclipped tensors with α, `paper` clips each tensor and adds noise per tensor (Algorithm 1),
`sound` clips the whole update and adds one noise draw per round. A rule that is no weighted
mean (a coordinate-wise median) gives its per-tensor `aggregate` instead, and only mode `none`
runs it.

Adding an aggregator is one `RULES.add(name, AggregationRule(...))`; its aggregator wildcard
values (`name`, `dp_<name>`) follow (`dpmed.fets.aggregation.aggregators`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from dpmed.fets.round_tensors import RoundTensors, TensorGroup, squared_norms, vectors
from dpmed.registry import Registry

EPS_SAFE = 1e-8  # Algorithm 1 line 4


@dataclass(frozen=True)
class LocalTensor:
    """One collaborator's value of one tensor, as OpenFL passes it to aggregation functions."""

    col_name: str
    tensor: np.ndarray
    weight: float


@dataclass(frozen=True)
class Clipped:
    """The vectors c_i v_i a rule weighs: one tensor's local values or the round's whole-model
    updates (`tensors`), scaled by the clip factors c (`factors`, None: not clipped)."""

    tensors: TensorGroup | RoundTensors
    factors: np.ndarray | None = None

    @property
    def n(self) -> int:
        """The number of vectors."""
        return self.tensors.n

    @cached_property
    def gram(self) -> np.ndarray:
        """The basis Gram matrix of the scaled vectors (`dpmed.fets.round_tensors`), taken once
        on first use: rules that weigh by similarity and paper mode's Δf share it."""
        return self.tensors.gram(self.factors)


# (vectors, data-size weights W as given, SimAgg distance name) → weights α of the vectors.
Weigh = Callable[[Clipped, Sequence[float], str], np.ndarray]


def normalised_weights(weights: Sequence[float]) -> np.ndarray:
    """Data-size weights scaled to sum 1; raises, naming them, unless there is at least one,
    all are finite and ≥ 0 and their sum is > 0 (a round without data has no average)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0:
        raise ValueError("0 collaborators: a round needs at least one update to aggregate")
    if not np.all(np.isfinite(w) & (w >= 0)) or not w.sum() > 0:
        raise ValueError(f"data-size weights must be finite, >= 0 and sum to > 0, got {w.tolist()}")
    return w / w.sum()


# --- similarity weights (SimAgg) -----------------------------------------------------------

# SimAgg distance name → similarity scores s (n,) from the coefficient rows y (n, n + 1) of the
# collaborators' (clipped) tensors in the basis of a Gram matrix `gram` (`round_tensors`; the
# rules take the Gram matrix of the clipped tensors, so y = `vectors(n)`).
SIMAGG_DISTANCES: Registry[Callable[[np.ndarray, np.ndarray], np.ndarray]] = Registry(
    "SimAgg distance"
)


@SIMAGG_DISTANCES.register("l2")
def l2_similarity(y: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """The paper's: d_i = ‖T̄ − T_i‖₂ (T̄ the unweighted mean), s_i = Σd/(1e-8 + d_i),
    unnormalised."""
    d = np.sqrt(squared_norms(y - y.mean(axis=0), gram))
    return d.sum() / (EPS_SAFE + d)


@SIMAGG_DISTANCES.register("sum_diff")
def sum_diff_similarity(y: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """The FeTS 2021 variant: d_i = |ΣT̄ − ΣT_i|, s_i = Σd/(1e-8 + d_i) normalised to sum 1."""
    sums = y @ gram[:, -1]
    d = np.abs(sums.mean() - sums)
    s = d.sum() / (EPS_SAFE + d)
    return s / s.sum()


def is_weight_or_bias(tensor_name: str) -> bool:
    """Algorithm 1 line 3: the similarity branch applies to tensors named weight or bias."""
    return "weight" in tensor_name or "bias" in tensor_name


# --- the weighings -------------------------------------------------------------------------


def data_size_mean(clipped: Clipped, weights: Sequence[float], distance: str) -> np.ndarray:
    """FedAvg: α = W / ΣW."""
    return normalised_weights(weights)


def uniform_mean(clipped: Clipped, weights: Sequence[float], distance: str) -> np.ndarray:
    """DP-FedAvg: α = 1/m, whatever the data sizes (McMahan et al. 2018)."""
    return np.full(clipped.n, 1.0 / clipped.n)


def similarity(clipped: Clipped, weights: Sequence[float], distance: str) -> np.ndarray:
    """SimAgg: the normalised similarity weights α of the vectors (Algorithm 1 lines 10–17):
    similarity scores s of the `distance` (a `SIMAGG_DISTANCES` name), ŵ = W + s,
    α = ŵ/(1e-8 + Σŵ)."""
    s = SIMAGG_DISTANCES[distance](vectors(clipped.n), clipped.gram)
    w_hat = np.asarray(weights, dtype=np.float64) + s
    return w_hat / (EPS_SAFE + w_hat.sum())


# --- the rule registry ---------------------------------------------------------------------


@dataclass(frozen=True)
class AggregationRule:
    """One aggregation rule, whatever the DP mode that wraps it.

    Args:
        label: its method name in tables and figures ("SimAgg"); the private ones are
            "DP-<label>" (`dpmed.fets.aggregation.AggregatorMode`).
        order: rank of its runs in tables and figures (then the DP mode's rank, ε0, seed).
        weigh: the weights α of the (clipped) vectors (`Weigh`); None for a rule that is no
            weighted mean.
        aggregate: such a rule's per-tensor aggregate, `aggregate(local_tensors, tensor_name,
            cfg) -> tensor` (`local_tensors` items have `.col_name`, `.tensor` and `.weight`,
            weights summing to 1; `cfg` the run's `ServerConfig`); DP mode none only.
        weighting: how privacy.json names `weigh` ("similarity weights").
        paper: the paper's per-tensor recipe (Algorithm 1, DP mode paper) is defined for it.
        sensitivity: the replace-one L2 sensitivity Δf(C, m) of its whole-model DP aggregate
            of m updates clipped to C; None: no whole-model DP mode accepts it.
        dp_weigh: its weighing under whole-model DP when not `weigh` (DP-FedAvg's uniform
            mean, whose Δf = 2C/m the data-size mean would not have).
        dp_weighting: its whole-model DP weighing and Δf, as privacy.json states them.
        privacy_extra: extra privacy.json fields of its whole-model DP runs, from the privacy
            columns of the last round.
    """

    label: str
    order: int
    weigh: Weigh | None = None
    aggregate: Callable[..., np.ndarray] | None = None
    weighting: str = ""
    paper: bool = False
    sensitivity: Callable[[float, int], float] | None = None
    dp_weigh: Weigh | None = None
    dp_weighting: str = ""
    privacy_extra: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if (self.weigh is None) == (self.aggregate is None):
            raise ValueError(f"rule {self.label!r}: give either weigh or aggregate")
        if self.paper and not (self.weigh and self.weighting):
            raise ValueError(f"rule {self.label!r}: paper mode needs weigh and its weighting text")
        if self.sensitivity is not None and not self.dp_weighting:
            raise ValueError(f"rule {self.label!r}: whole-model DP needs its mechanism text")
        if self.dp_weighting and self.sensitivity is None:
            raise ValueError(f"rule {self.label!r}: whole-model DP needs its sensitivity")
        if self.sensitivity is not None and self.weigh is None and self.dp_weigh is None:
            raise ValueError(f"rule {self.label!r}: whole-model DP needs a weighing")


# Registration order = the order of the aggregator wildcard values within each DP mode.
RULES: Registry[AggregationRule] = Registry("fets aggregation rule")
RULES.add(
    "fedavg",
    AggregationRule(
        "FedAvg",
        order=1,
        weigh=data_size_mean,
        weighting="data-size weights",
        sensitivity=lambda clip_norm, n_chosen: 2.0 * clip_norm / n_chosen,  # uniform mean of m
        dp_weigh=uniform_mean,
        dp_weighting="uniform mean, Delta f = 2C/m, sigma = z*C/m",
        privacy_extra=lambda last: {"z": 2.0 * last["noise_multiplier"]},  # σ = z·C/m
    ),
)
RULES.add(
    "simagg",
    AggregationRule(
        "SimAgg",
        order=0,
        weigh=similarity,
        weighting="similarity weights",
        paper=True,
        sensitivity=lambda clip_norm, n_chosen: 2.0 * clip_norm,  # any normalised weighting
        dp_weighting="similarity weights on clipped updates, Delta f = 2C",
    ),
)
