"""The fets DP modes, which wrap the aggregation rules of `dpmed.fets.aggregators` (paper 000,
Algorithms 1–3), the aggregators they make, and the server's configuration.

A DP mode is one `DP_MODES` entry that wraps any rule it accepts, as Flower's
`DifferentialPrivacyServerSideFixedClipping` wraps any strategy: `none` combines the tensors
with the rule's weights; `paper` clips each tensor and adds the classic Gaussian noise per
tensor (Algorithms 1–3); `sound` clips each whole-model update jointly and adds one Gaussian
mechanism calibrated for the rule's sensitivity. An aggregator is a (rule, DP mode) pair: its
wildcard value is the rule's name under mode none and `dp_<rule>` under the private modes
(`aggregators`); its label, report order and privacy texts follow from the two entries
(`aggregator_mode`). The config schema's enums list the same names in the same order
(tests/test_fets_registry.py checks it).

Everything here is a pure function of the tensors and data-size weights the collaborators send
and the caller's noise generator, read through the block passes of `dpmed.fets.round_tensors`.
The server screens every update before a rule sees it (`dpmed.fets.server.screen_round`); a
release handed an update whose norm is not finite raises (`clip_factors`).

The models have no norm buffers (GroupNorm / InstanceNorm without running stats), so every
state tensor is a trained parameter; `RoundTensors.updates` refuses non-float tensors and the
simulation refuses models with buffers, so no tensor ever bypasses clipping and noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from dpmed.fets.aggregators import (
    RULES,
    SIMAGG_DISTANCES,
    AggregationRule,
    Clipped,
    LocalTensor,
    is_weight_or_bias,
    normalised_weights,
)
from dpmed.fets.round_tensors import RoundTensors, TensorGroup, ones, squared_norms, vectors
from dpmed.privacy.normals import NormalDraw, NormalSource
from dpmed.registry import Registry


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


@dataclass(frozen=True)
class RoundMechanisms:
    """The Gaussian mechanisms of one round: count, largest Δf and σ, smallest σ, σ/Δf, the
    whole-model weights α, and the updates the server's screen rejected (counted as zero
    updates; `dpmed.fets.server.Rejection`)."""

    mechanisms: int
    delta_f: float
    sigma: float
    sigma_min: float
    noise_multiplier: float
    alpha: tuple[float, ...] = ()
    rejected: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ScreenedRound:
    """A round after `dpmed.fets.server.screen_round`, as a DP mode releases it.

    Args:
        local: the (name, state, weight) triples, weights normalised to sum 1, a rejected
            collaborator's state replaced by the global model (a zero update).
        updates: the updates of `local` against the global model.
        rejected: the rejected updates, in collaborator order.
    """

    local: list[tuple[str, Mapping[str, np.ndarray], float]]
    updates: RoundTensors
    rejected: tuple[Any, ...]


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


def flatten_state(state: Mapping[str, np.ndarray]) -> np.ndarray:
    """Concatenate the float tensors of a state dict (in key order) into one vector."""
    for name, value in state.items():
        if np.asarray(value).dtype.kind != "f":
            raise ValueError(f"tensor '{name}' is not floating point; no aggregation rule for it")
    return np.concatenate([np.asarray(v).ravel() for v in state.values()])


# --- the releases of the DP modes ----------------------------------------------------------


def paper_release(
    rule: AggregationRule,
    tensors: Sequence[np.ndarray],
    weights: Sequence[float],
    tensor_name: str,
    clip_norm: float,
    epsilon0: float,
    delta0: float,
    rng: Any,
) -> tuple[np.ndarray, MechanismInfo | None]:
    """Algorithm 1 with `rule`'s weights, for one tensor: L2Clip of Algorithm 3 (scalars are
    not clipped), the rule's weights α of the clipped tensors with the L2 distance (line 11),
    the empirical Δf from the neighbour T'_0 = 1·C with the *same* weights — pm − pm' =
    α_0 (T̃_0 − 1·C), lines 19–21 — and the classic Gaussian σ of Algorithm 2. Not a DP
    guarantee: Δf is measured on one neighbour instead of bounded, and the classic σ is proven
    for ε ≤ 1 only. `rng`: a noise generator (`standard_normal`). A size-0 tensor releases
    nothing: it comes back empty, draws no noise and is no mechanism.

    Returns:
        (noisy aggregate, the mechanism applied; None for a size-0 tensor).
    """
    from dpmed.privacy.mechanisms import classic_sigma  # scipy: imported on first use

    check_clip_norm(clip_norm)
    group = TensorGroup.of(tensors)
    if group.size == 0:
        return np.empty(group.shape, group.dtype), None
    if is_weight_or_bias(tensor_name):
        scalar = group.shape == ()
        factors = np.ones(group.n) if scalar else clip_factors(group.sq_norms, clip_norm)[0]
        clipped = Clipped(group, factors)  # its Gram matrix: of the clipped tensors, lines 7–9
        alpha = rule.weigh(clipped, weights, "l2")  # lines 10–17
        beta = alpha * factors  # line 18
        gap = vectors(group.n)[0] - clip_norm * ones(group.n)  # T̃_0 − 1·C
        delta_f = float(alpha[0] * np.sqrt(squared_norms(gap, clipped.gram)[0]))  # lines 19–21
        branch = "weight"
    else:
        beta = normalised_weights(weights)  # line 25
        delta_f = float(clip_norm)  # line 26
        branch = "other"
    sigma = classic_sigma(delta_f, epsilon0, delta0)  # Algorithm 2 step 1
    noisy = group.combine(beta, normals(rng, group.size, group.dtype), sigma)
    z = math.sqrt(2.0 * math.log(1.25 / delta0)) / epsilon0  # σ/Δf of the classic σ
    return noisy, MechanismInfo(tensor_name, delta_f, sigma, branch, z)


def sound_release(
    rule: AggregationRule,
    updates: RoundTensors,
    weights: Sequence[float],
    clip_norm: float,
    sigma: float,
    rng: Any,
    distance: str = "l2",
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Whole-model DP with `rule`'s weights (server-side fixed clipping): clip each update u_i
    jointly to ‖u_i‖ ≤ C, the rule's weights α of the clipped updates (`dp_weigh`, else
    `weigh`), o + Σ α_i ũ_i + N(0, σ²I); σ must be calibrated for the rule's sensitivity.

    Returns:
        (noisy new state by tensor name, α).
    """
    check_clip_norm(clip_norm)
    factors, _ = clip_factors(updates.sq_norms.sum(axis=1), clip_norm)
    weigh = rule.dp_weigh or rule.weigh
    alpha = weigh(Clipped(updates, factors), weights, distance)
    noise = normals(rng, updates.size, updates.dtype)
    return updates.combine(alpha * factors, noise, sigma), alpha


# --- DP modes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DPMode:
    """How the server releases a round, wrapping any aggregation rule it accepts.

    `release` is called with the rule first and then:

    - per tensor: `(local_tensors, tensor_name, cfg, rng) -> (tensor, MechanismInfo | None)`;
    - whole model: `(updates, weights, clip_norm, sigma, rng, distance) -> (new state, α)` on
      the round's
      updates u_i = w_i − w_global (a `dpmed.fets.round_tensors.RoundTensors`), one Gaussian
      mechanism N(0, σ²I) with σ calibrated for the rule's `sensitivity`.

    `local_tensors` items have `.col_name`, `.tensor` and `.weight` (weights sum to 1 over the
    round); `cfg` is the run's `ServerConfig`.

    Args:
        guarantee: what privacy.json claims: "none" (no noise), "paper-approximation" (the
            paper's accounting, which is not a formal guarantee) or "dp".
        per_tensor: the release runs once per tensor instead of once on the whole-model update.
        rank: rank of its runs among one rule's in tables and figures.
        accepts: whether it can wrap a rule.
        release: the release (call shape above).
        mechanism: private modes: the mechanism as privacy.json states it, from the method
            name and the rule.
        reasons: paper approximations: why the stated ε is not a formal guarantee (privacy
            flaws only).
        utility_notes: flaws of the recipe that cost accuracy but not privacy.
    """

    guarantee: str
    per_tensor: bool
    rank: int
    accepts: Callable[[AggregationRule], bool]
    release: Callable[..., Any]
    mechanism: Callable[[str, AggregationRule], str] | None = None
    reasons: tuple[str, ...] = ()
    utility_notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.private and self.mechanism is None:
            raise ValueError(f"a private DP mode ({self.guarantee}) needs its mechanism text")
        if self.guarantee == "paper-approximation" and not self.reasons:
            raise ValueError("a paper-approximation DP mode needs the reasons it is no DP")

    @property
    def private(self) -> bool:
        """Noise is added (the job needs a finite ε0)."""
        return self.guarantee != "none"


def _none_release(
    rule: AggregationRule, local: Sequence[LocalTensor], tensor_name: str, cfg: ServerConfig,
    rng: Any,
) -> tuple[np.ndarray, None]:  # fmt: skip
    """The rule's aggregate of one tensor, without clipping or noise: its weights for weight
    and bias tensors, the data-size mean for the others (Algorithm 1 lines 3 and 25)."""
    if rule.aggregate is not None:
        return rule.aggregate(local, tensor_name, cfg), None
    group = TensorGroup.of([t.tensor for t in local])
    weights = [t.weight for t in local]
    if not is_weight_or_bias(tensor_name):
        return group.combine(normalised_weights(weights)), None
    return group.combine(rule.weigh(Clipped(group), weights, cfg.simagg_distance)), None


def _paper_release(
    rule: AggregationRule, local: Sequence[LocalTensor], tensor_name: str, cfg: ServerConfig,
    rng: Any,
) -> tuple[np.ndarray, MechanismInfo | None]:  # fmt: skip
    """Algorithm 1 on one tensor at the run's (C, ε0, δ0) (None: a size-0 tensor)."""
    tensors, weights = [t.tensor for t in local], [t.weight for t in local]
    return paper_release(
        rule, tensors, weights, tensor_name, cfg.clip_norm, cfg.epsilon0, cfg.delta0, rng
    )


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

# Registration order = config enum order; `rank` orders a rule's runs in tables.
DP_MODES: Registry[DPMode] = Registry("fets DP mode")
DP_MODES.add("none", DPMode("none", True, rank=1, accepts=lambda rule: True,
                            release=_none_release))  # fmt: skip
DP_MODES.add(
    "paper",
    DPMode(
        "paper-approximation",
        True,
        rank=0,
        accepts=lambda rule: rule.paper,
        release=_paper_release,
        mechanism=lambda name, rule: (
            f"{name} (Algorithms 1-3): per-tensor clipping of weights "
            f"at C, {rule.weighting}, empirical Delta f, classic Gaussian sigma per tensor"
        ),
        reasons=PAPER_REASONS,
        utility_notes=PAPER_UTILITY_NOTES,
    ),
)
DP_MODES.add(
    "sound",
    DPMode(
        "dp",
        False,
        rank=2,
        accepts=lambda rule: rule.sensitivity is not None,
        release=sound_release,
        mechanism=lambda name, rule: (
            f"{name}: whole-model updates clipped jointly to C, {rule.dp_weighting}"
        ),
    ),
)


# --- aggregators: (rule, DP mode) pairs ----------------------------------------------------


@dataclass(frozen=True)
class Aggregator:
    """An aggregator wildcard value: its rule, whether it is private, its DP modes (in
    `DP_MODES` order)."""

    rule: str
    private: bool
    modes: tuple[str, ...]


@lru_cache(maxsize=4)
def _derive_aggregators(
    rules: tuple[tuple[str, AggregationRule], ...], modes: tuple[tuple[str, DPMode], ...]
) -> Registry[Aggregator]:
    """The aggregator wildcard values of the (rule, DP mode) pairs, by DP mode then rule
    (fedavg, simagg, dp_simagg, dp_fedavg): a rule's name, or `dp_<rule>` under a private
    mode, so a private run's folder says so."""
    found: dict[str, tuple[str, bool, list[str]]] = {}
    for dpmode, mode in modes:
        for rule_name, rule in rules:
            if mode.accepts(rule):
                name = f"dp_{rule_name}" if mode.private else rule_name
                found.setdefault(name, (rule_name, mode.private, []))[2].append(dpmode)
    out: Registry[Aggregator] = Registry("fets aggregator")
    for name, (rule_name, private, modes) in found.items():
        out.add(name, Aggregator(rule_name, private, tuple(modes)))
    return out


def aggregators() -> Registry[Aggregator]:
    """The aggregators of the rules and DP modes registered now: registering or removing one
    adds or removes its values."""
    return _derive_aggregators(tuple(RULES.items()), tuple(DP_MODES.items()))


@dataclass(frozen=True)
class AggregatorMode:
    """One aggregator in one DP mode: the rule, the DP mode wrapping it, and what follows.

    Args:
        rule: the aggregation rule.
        dp: the DP mode.
        label: the method name of tables and figures ("DP-SimAgg paper"); private runs add
            " eps0=<ε0>".
        mechanism: private modes: the mechanism as privacy.json states it.
    """

    rule: AggregationRule
    dp: DPMode
    label: str
    mechanism: str | None

    @property
    def order(self) -> int:
        """Rank of its runs in tables and figures: by rule, then DP mode (then ε0, seed)."""
        return self.rule.order * len(DP_MODES) + self.dp.rank

    def sound_sigma(self, cfg: ServerConfig, n_chosen: int) -> tuple[float, float]:
        """(σ, Δf) of a whole-model DP mode's one mechanism per round of `n_chosen` updates
        (the rule's sensitivity, calibrated at the run's ε0, δ0)."""
        from dpmed.privacy.mechanisms import calibrate  # scipy: imported on first use

        delta_f = self.rule.sensitivity(cfg.clip_norm, n_chosen)
        return calibrate(cfg.sound_calibration, delta_f, cfg.epsilon0, cfg.delta0), delta_f

    def aggregate(
        self, cfg: ServerConfig, screened: ScreenedRound, rng: Any
    ) -> tuple[dict[str, np.ndarray], RoundMechanisms | None]:
        """One round's release: the next global state from the screened round
        (`dpmed.fets.server.screen_round`) and its mechanisms (None: no noise added). Per
        tensor, the DP mode's release of each tensor of the global model; whole model, one
        release of the round's updates, calibrated for the count m of every chosen
        collaborator (rejected ones included). `rng`: the round's noise source."""
        if not self.dp.per_tensor:
            weights = [w for _, _, w in screened.local]
            sigma, delta_f = self.sound_sigma(cfg, len(weights))
            new, alpha = self.dp.release(
                self.rule, screened.updates, weights, cfg.clip_norm, sigma, rng, cfg.simagg_distance
            )
            alphas = tuple(float(a) for a in alpha)
            return new, RoundMechanisms(1, delta_f, sigma, sigma, sigma / delta_f, alphas,
                                        screened.rejected)  # fmt: skip
        out: dict[str, np.ndarray] = {}
        infos: list[MechanismInfo] = []
        for name in screened.updates.groups:  # the global model's tensors, in its order
            tensors = [LocalTensor(c, state[name], w) for c, state, w in screened.local]
            out[name], info = self.dp.release(self.rule, tensors, name, cfg, rng)
            infos += [info] if info is not None else []
        if not infos:
            return out, None
        sigmas = [i.sigma for i in infos]
        return out, RoundMechanisms(len(infos), max(i.delta_f for i in infos), max(sigmas),
                                    min(sigmas), min(i.noise_multiplier for i in infos),
                                    rejected=screened.rejected)  # fmt: skip


def aggregator_mode(name: str, dpmode: str) -> AggregatorMode:
    """Aggregator `name` in DP mode `dpmode`. Private labels are "DP-<rule label>", with the
    mode's name where the rule has more than one private mode ("DP-SimAgg sound")."""
    entry = aggregators()[name]
    if dpmode not in entry.modes:
        raise ValueError(f"aggregator {name!r} has no DP mode {dpmode!r}")
    rule, mode = RULES[entry.rule], DP_MODES[dpmode]
    if not mode.private:
        return AggregatorMode(rule, mode, rule.label, None)
    label = method = f"DP-{rule.label}"
    if len(entry.modes) > 1:
        label, method = f"{label} {dpmode}", f"{label} {dpmode} mode"
    return AggregatorMode(rule, mode, label, mode.mechanism(method, rule))


@dataclass(frozen=True)
class ServerConfig:
    """What the aggregator is configured with (no data).

    Args:
        aggregator: a registered aggregator (`aggregators`).
        dpmode: one of its DP modes.
        epsilon0: per-round ε0 (None for the non-private mode).
        delta0: per-round δ0.
        clip_norm: C.
        simagg_distance: a `dpmed.fets.aggregators.SIMAGG_DISTANCES` name.
        sound_calibration: Gaussian calibration of the whole-model modes (`analytic`, `rdp`).
        seed: the job seed of the noise draws (reproducible simulation); None draws every
            round's noise from OS entropy (deployment).
    """

    aggregator: str
    dpmode: str
    epsilon0: float | None
    delta0: float
    clip_norm: float
    simagg_distance: str
    sound_calibration: str
    seed: int | None

    def __post_init__(self) -> None:
        aggregator_mode(self.aggregator, self.dpmode)  # both registered, the pair supported
        SIMAGG_DISTANCES[self.simagg_distance]  # registered
        if (self.epsilon0 is None) == DP_MODES[self.dpmode].private:
            raise ValueError("a finite epsilon0 goes with the DP aggregators only")
        if DP_MODES[self.dpmode].private:
            check_clip_norm(self.clip_norm)

    @cached_property
    def mode(self) -> AggregatorMode:
        """The rule, DP mode and texts of (aggregator, dpmode), looked up once."""
        return aggregator_mode(self.aggregator, self.dpmode)
