"""Server-side aggregation of one round's collaborator tensors (paper 000, Algorithms 1–3) and
the registries of the fets aggregators and DP modes.

Everything here is a pure function of the tensors and data-size weights the collaborators send
(plus the caller's noise generator, `dpmed.fets.server.noise_generator`): no collaborator data
can reach it. Each rule reads the round's tensors through the block passes of
`dpmed.fets.round_tensors` (float64 norms for clipping, a Gram matrix for distances where the
rule weighs by similarity, then one combination). The server screens every collaborator's
update before a rule sees it (`dpmed.fets.server.screen_round`); a rule handed an update whose
norm is not finite raises (`clip_factors`) rather than pass it unclipped.

An aggregator is one `register_aggregator` call per DP mode it supports, at the end of this
module: its server rule, display label, report order and, for the private modes,
its sensitivity and privacy-record texts. The wildcard patterns, the validity rule, the
server, the privacy record and the report read them from `AGGREGATORS` and `DP_MODES`; the
config schema's enums list the same names in the same order (tests/test_fets_registry.py
checks it).

The models have no norm buffers (GroupNorm / InstanceNorm without running stats), so every
state tensor is a trained parameter; `RoundTensors.updates` refuses non-float tensors and the
simulation refuses models with buffers, so no tensor ever bypasses clipping and noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dpmed.fets.round_tensors import RoundTensors, TensorGroup, ones, squared_norms, vectors
from dpmed.privacy.normals import NormalDraw, NormalSource
from dpmed.registry import Registry

if TYPE_CHECKING:
    from dpmed.fets.server import ServerConfig

EPS_SAFE = 1e-8  # Algorithm 1 line 4


@dataclass(frozen=True)
class LocalTensor:
    """One collaborator's value of one tensor, as OpenFL passes it to aggregation functions."""

    col_name: str
    tensor: np.ndarray
    weight: float


@dataclass(frozen=True)
class MechanismInfo:
    """One Gaussian mechanism applied by the server to one tensor.

    Args:
        tensor_name: the tensor it released.
        delta_f: the L2 sensitivity it was calibrated for.
        sigma: the noise standard deviation.
        branch: "weight" (Algorithm 1 lines 3–23) or "other" (lines 24–28).
        noise_multiplier: σ/Δf of the calibration (the same for every tensor of a round).
    """

    tensor_name: str
    delta_f: float
    sigma: float
    branch: str
    noise_multiplier: float


# --- DP modes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DPMode:
    """How the server releases a round, whatever the aggregator.

    The server calls an aggregator's rule for the mode with:

    - non-private, per tensor: `rule(local_tensors, tensor_name, cfg) -> tensor`;
    - private, per tensor: `rule(local_tensors, tensor_name, cfg, rng) -> (tensor,
      MechanismInfo)`, one Gaussian mechanism per tensor;
    - private, whole model: `rule(updates, weights, cfg, sigma, rng) -> (new state, α)` on the
      round's updates u_i = w_i − w_global (a `dpmed.fets.round_tensors.RoundTensors`), one
      Gaussian mechanism N(0, σ²I) with σ calibrated for the rule's
      `sensitivity`.

    `local_tensors` items have `.col_name`, `.tensor` and `.weight` (weights sum to 1 over the
    round); `cfg` is the run's `dpmed.fets.server.ServerConfig`.

    Args:
        guarantee: what privacy.json claims: "none" (no noise), "paper-approximation" (the
            paper's accounting, which is not a formal guarantee) or "dp".
        per_tensor: the rule runs once per tensor instead of once on the whole-model update.
    """

    guarantee: str
    per_tensor: bool

    @property
    def private(self) -> bool:
        """Noise is added (the job needs a finite ε0)."""
        return self.guarantee != "none"


DP_MODES: Registry[DPMode] = Registry("fets DP mode")
DP_MODES.add("none", DPMode("none", per_tensor=True))
DP_MODES.add("paper", DPMode("paper-approximation", per_tensor=True))
DP_MODES.add("sound", DPMode("dp", per_tensor=False))


# --- aggregators ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AggregatorMode:
    """One aggregator in one DP mode.

    Args:
        rule: the server rule (call shape of the DP mode, see `DPMode`).
        label: the method name of tables and figures ("DP-SimAgg paper"); private runs add
            " eps0=<ε0>".
        order: rank of its runs in tables and figures (then ε0, then seed).
        sensitivity: whole-model DP modes: the replace-one L2 sensitivity Δf(C, m) of the
            aggregate of m clipped updates.
        mechanism: private modes: the mechanism as privacy.json states it.
        reasons: paper approximations: why the stated ε is not a formal guarantee (privacy
            flaws only).
        utility_notes: flaws of the recipe that cost accuracy but not privacy.
        privacy_extra: extra privacy.json fields from the privacy columns of the last round.
    """

    rule: Callable[..., Any]
    label: str
    order: int
    sensitivity: Callable[[float, int], float] | None = None
    mechanism: str | None = None
    reasons: tuple[str, ...] = ()
    utility_notes: tuple[str, ...] = ()
    privacy_extra: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Aggregator:
    """A registered aggregator: DP mode name → `AggregatorMode`, in registration order."""

    modes: dict[str, AggregatorMode] = field(default_factory=dict)


AGGREGATORS: Registry[Aggregator] = Registry("fets aggregator")


def register_aggregator(
    name: str,
    dpmode: str,
    *,
    label: str,
    order: int,
    sensitivity: Callable[[float, int], float] | None = None,
    mechanism: str | None = None,
    reasons: Sequence[str] = (),
    utility_notes: Sequence[str] = (),
    privacy_extra: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a server rule as aggregator `name` in DP mode `dpmode` (one call
    per mode the aggregator supports; the first one adds the aggregator). The remaining
    arguments are the `AggregatorMode` fields; what a mode needs is checked here."""
    mode = DP_MODES[dpmode]
    if mode.private and mechanism is None:
        raise ValueError(f"aggregator '{name}': DP mode '{dpmode}' needs its mechanism text")
    if mode.private and not mode.per_tensor and sensitivity is None:
        raise ValueError(f"aggregator '{name}': DP mode '{dpmode}' needs its sensitivity")
    if mode.guarantee == "paper-approximation" and not reasons:
        raise ValueError(f"aggregator '{name}': DP mode '{dpmode}' needs the reasons it is no DP")

    def decorate(rule: Callable[..., Any]) -> Callable[..., Any]:
        entry = AGGREGATORS[name] if name in AGGREGATORS else AGGREGATORS.add(name, Aggregator())
        if dpmode in entry.modes:
            raise ValueError(f"aggregator '{name}' already has DP mode '{dpmode}'")
        entry.modes[dpmode] = AggregatorMode(
            rule,
            label,
            order,
            sensitivity,
            mechanism,
            reasons=tuple(reasons),
            utility_notes=tuple(utility_notes),
            privacy_extra=privacy_extra,
        )
        return rule

    return decorate


def aggregator_mode(name: str, dpmode: str) -> AggregatorMode:
    """The registered `AggregatorMode` of aggregator `name` in DP mode `dpmode`."""
    modes = AGGREGATORS[name].modes
    if dpmode not in modes:
        raise ValueError(f"aggregator {name!r} has no DP mode {dpmode!r}")
    return modes[dpmode]


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


def check_clip_norm(clip_norm: float) -> None:
    """Refuse a clip norm C that is not finite and > 0: C = 0 releases the global model plus
    noise of σ = 0 and the sound modes' σ/Δf divides by zero."""
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be finite and > 0, got {clip_norm!r}")


def clip_factors(sq_norms: np.ndarray, clip_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 3 / joint clipping as factors: c_i = C/‖v_i‖ where ‖v_i‖ > C, else 1, from
    the float64 squared norms ‖v_i‖² (`RoundTensors.sq_norms` summed over tensors). Raises on a
    norm that is not finite: clipping it would leave NaN, never an update of norm ≤ C. Returns
    (c, ‖v_i‖)."""
    norms = np.sqrt(np.asarray(sq_norms, dtype=np.float64))
    bad = np.flatnonzero(~np.isfinite(norms))
    if bad.size:
        raise ValueError(
            f"update {int(bad[0])} has norm {norms[bad[0]]}: not clippable; the server screens "
            "every update before aggregation (dpmed.fets.server.screen_round)"
        )
    return np.where(norms > clip_norm, clip_norm / np.maximum(norms, 1e-300), 1.0), norms


def similarity_weights(
    y: np.ndarray, gram: np.ndarray, weights: Sequence[float], distance: str = "l2"
) -> np.ndarray:
    """Normalised weights α (Algorithm 1 lines 10–17) of the tensors with coefficient rows `y`
    in the basis of `gram` and data-size `weights`: similarity scores s of the `distance` (a
    `SIMAGG_DISTANCES` name), ŵ = W + s, α = ŵ/(1e-8 + Σŵ)."""
    s = SIMAGG_DISTANCES[distance](y, gram)
    w_hat = np.asarray(weights, dtype=np.float64) + s
    return w_hat / (EPS_SAFE + w_hat.sum())


def normals(rng: Any, size: int, dtype: np.dtype | type) -> np.ndarray | NormalDraw:
    """`size` standard normals for a mechanism (Algorithm 2 step 2) in `dtype` when it is
    float32 or float64, else float64: from a `NormalSource` (`dpmed.fets.server.noise_generator`)
    a `NormalDraw` that `combine` fills block by block; from any other generator, its
    `standard_normal` array."""
    dtype = np.dtype(dtype)
    dtype = dtype if dtype in (np.float32, np.float64) else np.dtype(np.float64)
    if isinstance(rng, NormalSource):
        return rng.draw(size, dtype)
    return rng.standard_normal(size, dtype=dtype)


def normalised_weights(weights: Sequence[float]) -> np.ndarray:
    """Data-size weights scaled to sum 1; raises, naming them, unless there is at least one,
    all are finite and ≥ 0 and their sum is > 0 (a round without data has no average)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0:
        raise ValueError("0 collaborators: a round needs at least one update to aggregate")
    if not np.all(np.isfinite(w) & (w >= 0)) or not w.sum() > 0:
        raise ValueError(f"data-size weights must be finite, >= 0 and sum to > 0, got {w.tolist()}")
    return w / w.sum()


# --- per-tensor rules (FeTS/OpenFL call shape) ---------------------------------------------


def fedavg(
    local_tensors: Sequence[LocalTensor],
    tensor_db: Any = None,
    tensor_name: str = "",
    fl_round: int = 0,
    collaborators_chosen_each_round: Any = None,
    collaborator_times_per_round: Any = None,
) -> np.ndarray:
    """FedAvg of one tensor, Σ W_i T_i / Σ W_i (FeTS challenge call shape)."""
    group = TensorGroup.of([t.tensor for t in local_tensors])
    return group.combine(normalised_weights([t.weight for t in local_tensors]))


def simagg(
    local_tensors: Sequence[LocalTensor],
    tensor_db: Any = None,
    tensor_name: str = "",
    fl_round: int = 0,
    collaborators_chosen_each_round: Any = None,
    collaborator_times_per_round: Any = None,
    distance: str = "l2",
) -> np.ndarray:
    """Non-private SimAgg of one tensor (FeTS challenge call shape): weight and bias tensors get
    the similarity weighting of Algorithm 1 lines 10–18 without clipping or noise, other
    tensors FedAvg. `distance`: a `SIMAGG_DISTANCES` name."""
    group = TensorGroup.of([t.tensor for t in local_tensors])
    weights = [t.weight for t in local_tensors]
    if not is_weight_or_bias(tensor_name):
        return group.combine(normalised_weights(weights))
    gram = group.gram()
    return group.combine(similarity_weights(vectors(group.n), gram, weights, distance))


def dp_simagg_paper_tensor(
    tensors: Sequence[np.ndarray],
    weights: Sequence[float],
    tensor_name: str,
    clip_norm: float,
    epsilon0: float,
    delta0: float,
    rng: Any,
) -> tuple[np.ndarray, MechanismInfo]:
    """Algorithm 1 exactly, for one tensor: L2Clip of Algorithm 3 (scalars are not clipped),
    similarity weights, the empirical Δf from the neighbour T'_0 = 1·C with the *same* weights
    — pm − pm' = α_0 (T̃_0 − 1·C), lines 19–21 — and the classic Gaussian σ of Algorithm 2.
    Not a DP guarantee: Δf is measured on one neighbour instead of bounded, and the classic σ
    is proven for ε ≤ 1 only. `rng`: a noise generator (`standard_normal`).

    Returns:
        (noisy aggregate, the mechanism applied).
    """
    from dpmed.privacy.mechanisms import classic_sigma  # scipy: imported on first use

    check_clip_norm(clip_norm)
    group = TensorGroup.of(tensors)
    if is_weight_or_bias(tensor_name):
        scalar = group.shape == ()
        factors = np.ones(group.n) if scalar else clip_factors(group.sq_norms, clip_norm)[0]
        gram = group.gram(factors)  # of the clipped tensors, lines 7–9
        y = vectors(group.n)
        alpha = similarity_weights(y, gram, weights, "l2")  # lines 10–17
        beta = alpha * factors  # line 18
        gap = y[0] - clip_norm * ones(group.n)  # T̃_0 − 1·C
        delta_f = float(alpha[0] * np.sqrt(squared_norms(gap, gram)[0]))  # lines 19–21
        branch = "weight"
    else:
        beta = normalised_weights(weights)  # line 25
        delta_f = float(clip_norm)  # line 26
        branch = "other"
    sigma = classic_sigma(delta_f, epsilon0, delta0)  # Algorithm 2 step 1
    noisy = group.combine(beta, normals(rng, group.size, group.dtype), sigma)
    z = math.sqrt(2.0 * math.log(1.25 / delta0)) / epsilon0  # σ/Δf of the classic σ
    return noisy, MechanismInfo(tensor_name, delta_f, sigma, branch, z)


# --- whole-model rules on the round's updates ----------------------------------------------


def dp_simagg_sound(
    updates: RoundTensors,
    weights: Sequence[float],
    clip_norm: float,
    sigma: float,
    rng: Any,
    distance: str = "l2",
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Sound DP-SimAgg of the round's updates u_i: clip each u_i jointly to ‖u_i‖ ≤ C,
    similarity weights α on the clipped updates (as in Algorithm 1), o + Σ α_i ũ_i + N(0, σ²I).
    The α are non-negative with Σα ≤ 1, so the outputs of neighbouring rounds (one
    collaborator's update replaced) both lie in the C-ball around o and differ by at most
    Δf = 2C; σ must be calibrated for it.

    Returns:
        (noisy new state by tensor name, α).
    """
    check_clip_norm(clip_norm)
    factors, _ = clip_factors(updates.sq_norms.sum(axis=1), clip_norm)
    gram = updates.gram(factors)  # of the clipped updates
    alpha = similarity_weights(vectors(updates.n), gram, weights, distance)
    noise = normals(rng, updates.size, updates.dtype)
    return updates.combine(alpha * factors, noise, sigma), alpha


def dp_fedavg(
    updates: RoundTensors, clip_norm: float, sigma: float, rng: Any
) -> dict[str, np.ndarray]:
    """DP-FedAvg of the round's updates (server-side fixed clipping, McMahan et al. 2018):
    o + mean of the updates clipped jointly to C + N(0, σ²I), σ = z·C/m; with replace-one
    adjacency Δf = 2C/m, so z = 2σ/Δf. Returns the noisy new state by tensor name."""
    check_clip_norm(clip_norm)
    factors, _ = clip_factors(updates.sq_norms.sum(axis=1), clip_norm)
    noise = normals(rng, updates.size, updates.dtype)
    return updates.combine(factors / updates.n, noise, sigma)


def flatten_state(state: Mapping[str, np.ndarray]) -> np.ndarray:
    """Concatenate the float tensors of a state dict (in key order) into one vector."""
    for name, value in state.items():
        if np.asarray(value).dtype.kind != "f":
            raise ValueError(f"tensor '{name}' is not floating point; no aggregation rule for it")
    return np.concatenate([np.asarray(v).ravel() for v in state.values()])


# --- the registered aggregators (registration order = config enum order) -------------------

# The classic Gaussian σ is a proven (ε, δ) bound for ε ≤ 1: a reason only where ε0 > 1
# (`dpmed.fets.privacy` leaves it out of the records of runs at ε0 ≤ 1).
CLASSIC_SIGMA_REASON = (
    "the classic Gaussian sigma = Delta sqrt(2 ln(1.25/delta))/eps is proven only for eps <= 1; "
    "used here at eps0 > 1 (docs/privacy.md, finding 3)"
)
# Why paper-mode ε is not a guarantee: these strings are written into privacy.json as they are.
PAPER_REASONS = (
    "Delta f is estimated from one simulated neighbour (T'_0 = 1*C), not an upper bound on the "
    "sensitivity; the 1*C neighbour has norm C*sqrt(d), outside the C-ball, and it reuses the "
    "real round's similarity weights (Algorithm 1 line 20), which change with the replaced "
    "tensor (docs/privacy.md, finding 1)",
    "each tensor gets its own (eps0, delta0) mechanism: one round is K mechanisms, the paper "
    "counts one (docs/privacy.md, finding 2)",
    CLASSIC_SIGMA_REASON,
)
# What paper mode costs in accuracy but not in privacy (privacy.json extra.utility_notes).
PAPER_UTILITY_NOTES = (
    "clipping acts on the full model weights, not on the updates: every clipped tensor, hence "
    "every weighted aggregate, stays in the C-ball, so privacy is unaffected, but weights of "
    "norm > C shrink every round and the noise scales with C, not with the update size "
    "(docs/privacy.md, note to finding 1)",
)


@register_aggregator("fedavg", "none", label="FedAvg", order=3)
def fedavg_rule(local: Sequence[LocalTensor], tensor_name: str, cfg: ServerConfig) -> np.ndarray:
    """FedAvg of one tensor."""
    return fedavg(local)


@register_aggregator("simagg", "none", label="SimAgg", order=1)
def simagg_rule(local: Sequence[LocalTensor], tensor_name: str, cfg: ServerConfig) -> np.ndarray:
    """Non-private SimAgg of one tensor with the run's distance."""
    return simagg(local, tensor_name=tensor_name, distance=cfg.simagg_distance)


@register_aggregator(
    "dp_simagg",
    "paper",
    label="DP-SimAgg paper",
    order=0,
    mechanism="DP-SimAgg paper mode (Algorithms 1-3): per-tensor clipping of weights at C, "
    "similarity weights, empirical Delta f, classic Gaussian sigma per tensor",
    reasons=PAPER_REASONS,
    utility_notes=PAPER_UTILITY_NOTES,
)
def dp_simagg_paper_rule(
    local: Sequence[LocalTensor], tensor_name: str, cfg: ServerConfig, rng: Any
) -> tuple[np.ndarray, MechanismInfo]:
    """Algorithm 1 on one tensor at the run's (C, ε0, δ0)."""
    tensors, weights = [t.tensor for t in local], [t.weight for t in local]
    return dp_simagg_paper_tensor(
        tensors, weights, tensor_name, cfg.clip_norm, cfg.epsilon0, cfg.delta0, rng
    )


@register_aggregator(
    "dp_simagg",
    "sound",
    label="DP-SimAgg sound",
    order=2,
    sensitivity=lambda clip_norm, n_chosen: 2.0 * clip_norm,  # any normalised weighting
    mechanism="DP-SimAgg sound mode: whole-model updates clipped jointly to C, similarity "
    "weights on clipped updates, Delta f = 2C",
)
def dp_simagg_sound_rule(
    updates: RoundTensors, weights: Sequence[float], cfg: ServerConfig, sigma: float, rng: Any
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Sound DP-SimAgg of the round's updates."""
    return dp_simagg_sound(updates, weights, cfg.clip_norm, sigma, rng, cfg.simagg_distance)


@register_aggregator(
    "dp_fedavg",
    "sound",
    label="DP-FedAvg",
    order=4,
    sensitivity=lambda clip_norm, n_chosen: 2.0 * clip_norm / n_chosen,  # uniform mean of m
    mechanism="DP-FedAvg: whole-model updates clipped jointly to C, uniform mean, "
    "Delta f = 2C/m, sigma = z*C/m",
    privacy_extra=lambda last: {"z": 2.0 * last["noise_multiplier"]},  # σ = z·C/m, Δf = 2C/m
)
def dp_fedavg_rule(
    updates: RoundTensors, weights: Sequence[float], cfg: ServerConfig, sigma: float, rng: Any
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """DP-FedAvg of the round's updates; α = 1/m."""
    return dp_fedavg(updates, cfg.clip_norm, sigma, rng), np.full(updates.n, 1.0 / updates.n)
