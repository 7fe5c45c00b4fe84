"""Server-side aggregation of one round's collaborator tensors (paper 000, Algorithms 1–3).

Everything here is a pure function of the tensors and data-size weights the collaborators send
(plus a seeded noise generator): no collaborator data can reach it.

Per-tensor rules, with the FeTS/OpenFL custom-aggregation call shape
`fn(local_tensors, tensor_db, tensor_name, fl_round, collaborators_chosen_each_round,
collaborator_times_per_round) -> np.ndarray` (`local_tensors` items have `.col_name`,
`.tensor`, `.weight`; weights sum to 1 over the round):

- `fedavg`: Σ W_i T_i / Σ W_i.
- `simagg` (non-private SimAgg): for weight/bias tensors the similarity weighting of
  Algorithm 1 lines 10–18 without clipping or noise; `distance="l2"` is the paper's
  d_i = ‖T̄ − T_i‖₂ with s_i = Σd/(1e-8 + d_i) added unnormalised to W_i; `distance="sum_diff"`
  is the FeTS-2021 variant d_i = |ΣT̄ − ΣT_i| with s normalised to sum 1 before adding. Other
  tensors: FedAvg.
- `dp_simagg_paper_tensor`: Algorithm 1 exactly (L2Clip of Algorithm 3, similarity weights,
  empirical Δf from the neighbour T'_0 = 1·C with the *same* weights, classic Gaussian σ of
  Algorithm 2). Not a DP guarantee (REFERENCE.md §4 items 1–3); its `MechanismInfo` is logged.

Whole-model rules on the round's flattened updates u_i = w_i − w_global (shape (n, d)):

- `dp_simagg_sound`: clip each u_i jointly to ‖u_i‖ ≤ C, similarity weights (as in Algorithm 1,
  on the clipped updates), Σ α_i ũ_i, one Gaussian mechanism N(0, σ²I) with σ calibrated for
  Δf = 2C: the α are non-negative with Σα ≤ 1, so both outputs of neighbouring rounds (one
  collaborator's update replaced) lie in the C-ball and differ by at most 2C.
- `dp_fedavg`: clip jointly to C, uniform weights 1/m, noise σ = z·C/m (server-side fixed
  clipping, McMahan et al. 2018); with replace-one adjacency Δf = 2C/m, so z = 2σ_Δ/Δ.

Norm buffers: the models here have none (GroupNorm / InstanceNorm without running stats), so
every state tensor is a trained parameter; `flatten_state` refuses non-float tensors and the
simulation refuses models with buffers, so no tensor ever bypasses clipping and noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpmed.federated.averaging import weighted_mean, weighted_sum
from dpmed.privacy.mechanisms import classic_sigma

EPS_SAFE = 1e-8  # Algorithm 1 line 4
DISTANCES = ("l2", "sum_diff")


@dataclass(frozen=True)
class LocalTensor:
    """One collaborator's value of one tensor, as OpenFL passes it to aggregation functions."""

    col_name: str
    tensor: np.ndarray
    weight: float


@dataclass(frozen=True)
class MechanismInfo:
    """One Gaussian mechanism applied by the server: L2 sensitivity used and noise std."""

    tensor_name: str
    delta_f: float
    sigma: float
    branch: str  # "weight" (Algorithm 1 lines 3–23), "other" (lines 24–28) or "model"


def is_weight_or_bias(tensor_name: str) -> bool:
    """Algorithm 1 line 3: the similarity branch applies to tensors named weight or bias."""
    return "weight" in tensor_name or "bias" in tensor_name


def l2_clip(v: np.ndarray, clip_norm: float) -> np.ndarray:
    """Algorithm 3: scalars unchanged; otherwise v·C/‖v‖₂ when ‖v‖₂ > C, else v."""
    v = np.asarray(v)
    if v.ndim == 0:
        return v
    norm = _norm(v)
    if norm > clip_norm:
        return (v * (clip_norm / norm)).astype(v.dtype, copy=False)
    return v


def similarity_weights(
    tensors: Sequence[np.ndarray] | np.ndarray, weights: Sequence[float], distance: str = "l2"
) -> np.ndarray:
    """Normalised weights α (Algorithm 1 lines 10–17) of `tensors` with data-size `weights`.

    l2: T̄ = unweighted mean, d_i = ‖T̄ − T_i‖₂, s_i = Σd/(1e-8 + d_i), ŵ = W + s,
    α = ŵ/(1e-8 + Σŵ). sum_diff (FeTS 2021): d_i = |ΣT̄ − ΣT_i|, s normalised to sum 1 first.
    """
    flat = [np.asarray(t).reshape(-1) for t in tensors]
    mean = weighted_sum(flat, np.full(len(flat), 1.0 / len(flat)))
    if distance == "l2":
        scratch = np.empty_like(mean)
        d = np.array([_norm(np.subtract(f, mean, out=scratch)) for f in flat])
        s = d.sum() / (EPS_SAFE + d)
    elif distance == "sum_diff":
        total = float(mean.sum(dtype=np.float64))
        d = np.array([abs(total - float(f.sum(dtype=np.float64))) for f in flat])
        s = d.sum() / (EPS_SAFE + d)
        s = s / s.sum()
    else:
        raise ValueError(f"unknown SimAgg distance '{distance}' (known: {', '.join(DISTANCES)})")
    w_hat = np.asarray(weights, dtype=np.float64) + s
    return w_hat / (EPS_SAFE + w_hat.sum())


def _norm(v: np.ndarray) -> float:
    """‖v‖₂ (BLAS dot in the array's own precision: one pass, no float64 copy)."""
    flat = v.reshape(-1)
    return float(np.sqrt(np.dot(flat, flat)))


def fedavg(
    local_tensors: Sequence[LocalTensor],
    tensor_db: Any = None,
    tensor_name: str = "",
    fl_round: int = 0,
    collaborators_chosen_each_round: Any = None,
    collaborator_times_per_round: Any = None,
) -> np.ndarray:
    """FedAvg of one tensor (FeTS call shape)."""
    return weighted_mean([t.tensor for t in local_tensors], [t.weight for t in local_tensors])


def simagg(
    local_tensors: Sequence[LocalTensor],
    tensor_db: Any = None,
    tensor_name: str = "",
    fl_round: int = 0,
    collaborators_chosen_each_round: Any = None,
    collaborator_times_per_round: Any = None,
    distance: str = "l2",
) -> np.ndarray:
    """Non-private SimAgg of one tensor (FeTS call shape; `distance` l2 or sum_diff)."""
    tensors = [t.tensor for t in local_tensors]
    weights = [t.weight for t in local_tensors]
    if not is_weight_or_bias(tensor_name):
        return weighted_mean(tensors, weights)
    return weighted_sum(tensors, similarity_weights(tensors, weights, distance))


def gaussian_noise(
    shape: tuple[int, ...], sigma: float, rng: np.random.Generator, dtype: np.dtype | type
) -> np.ndarray:
    """N(0, σ²I) of `shape` (Algorithm 2 step 2), drawn in `dtype` (float32 or float64)."""
    dtype = np.dtype(dtype)
    draw_dtype = dtype if dtype in (np.float32, np.float64) else np.float64
    return (rng.standard_normal(shape, dtype=draw_dtype) * sigma).astype(dtype, copy=False)


def dp_simagg_paper_tensor(
    tensors: Sequence[np.ndarray],
    weights: Sequence[float],
    tensor_name: str,
    clip_norm: float,
    epsilon0: float,
    delta0: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, MechanismInfo]:
    """Algorithm 1 for one tensor: (noisy aggregate, the mechanism applied)."""
    tensors = [np.asarray(t) for t in tensors]
    if is_weight_or_bias(tensor_name):
        clipped = [l2_clip(t, clip_norm) for t in tensors]  # lines 7–9
        alpha = similarity_weights(clipped, weights, "l2")  # lines 10–17
        pm = weighted_sum(clipped, alpha)  # line 18
        neighbour = [np.ones_like(clipped[0]) * clip_norm, *clipped[1:]]  # line 19
        pm_prime = weighted_sum(neighbour, alpha)  # line 20
        delta_f = _norm(pm - pm_prime)  # line 21
        branch = "weight"
    else:
        pm = weighted_mean(tensors, weights)  # line 25
        delta_f = float(clip_norm)  # line 26
        branch = "other"
    sigma = classic_sigma(delta_f, epsilon0, delta0)  # Algorithm 2 step 1
    noisy = pm + gaussian_noise(pm.shape, sigma, rng, pm.dtype)
    return noisy.astype(pm.dtype, copy=False), MechanismInfo(tensor_name, delta_f, sigma, branch)


def clip_rows(
    updates: np.ndarray, clip_norm: float, inplace: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Clip each row (one collaborator's flattened update) jointly to L2 norm ≤ C.
    Returns (clipped rows, the norms before clipping); `inplace` rescales `updates` itself."""
    norms = np.array([_norm(row) for row in updates])
    scale = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
    out = updates if inplace else updates.copy()
    for row, factor in zip(out, scale, strict=True):
        if factor < 1.0:
            row *= row.dtype.type(factor)
    return out, norms


def dp_simagg_sound(
    updates: np.ndarray,
    weights: Sequence[float],
    clip_norm: float,
    sigma: float,
    rng: np.random.Generator,
    distance: str = "l2",
    inplace: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Sound DP-SimAgg of flattened updates (n, d): (Σ α_i clip(u_i) + N(0, σ²I), α).
    σ must be calibrated for Δf = 2C (see `sound_sensitivity`); `inplace` clips `updates`."""
    clipped, _ = clip_rows(updates, clip_norm, inplace)
    alpha = similarity_weights(clipped, weights, distance)
    agg = (alpha.astype(clipped.dtype) @ clipped).astype(updates.dtype, copy=False)
    return agg + gaussian_noise(agg.shape, sigma, rng, agg.dtype), alpha


def dp_fedavg(
    updates: np.ndarray,
    clip_norm: float,
    sigma: float,
    rng: np.random.Generator,
    inplace: bool = False,
) -> np.ndarray:
    """DP-FedAvg of flattened updates (n, d): mean of the clipped updates + N(0, σ²I),
    σ = z·C/m; `inplace` clips `updates`."""
    clipped, _ = clip_rows(updates, clip_norm, inplace)
    agg = weighted_sum(list(clipped), np.full(len(clipped), 1.0 / len(clipped)))
    return agg + gaussian_noise(agg.shape, sigma, rng, agg.dtype)


def sound_sensitivity(clip_norm: float, n_chosen: int, aggregator: str) -> float:
    """Replace-one (collaborator-level) L2 sensitivity: 2C for any normalised weighting
    (dp_simagg), 2C/m for the uniform mean of m clipped updates (dp_fedavg)."""
    if aggregator == "dp_simagg":
        return 2.0 * clip_norm
    if aggregator == "dp_fedavg":
        return 2.0 * clip_norm / n_chosen
    raise ValueError(f"no sound sensitivity for aggregator '{aggregator}'")


def stack_updates(
    global_state: Mapping[str, np.ndarray], local_states: Sequence[Mapping[str, np.ndarray]]
) -> np.ndarray:
    """(n, d) array of the flattened updates w_i − w_global (key order of `global_state`),
    written in place into one preallocated array."""
    flatten_state({k: np.asarray(v)[:0] for k, v in global_state.items()})  # dtype check only
    sizes = [np.asarray(v).size for v in global_state.values()]
    dtype = np.result_type(*global_state.values())
    out = np.empty((len(local_states), sum(sizes)), dtype=dtype)
    for row, state in zip(out, local_states, strict=True):
        start = 0
        for (name, value), size in zip(global_state.items(), sizes, strict=True):
            local = np.asarray(state[name])
            if local.shape != np.shape(value):
                raise ValueError(f"tensor '{name}': local shape {local.shape} != {np.shape(value)}")
            np.subtract(local.reshape(-1), np.asarray(value).reshape(-1),
                        out=row[start : start + size])  # fmt: skip
            start += size
    return out


def flatten_state(state: Mapping[str, np.ndarray]) -> np.ndarray:
    """Concatenate the float tensors of a state dict (in key order) into one vector."""
    for name, value in state.items():
        if np.asarray(value).dtype.kind != "f":
            raise ValueError(f"tensor '{name}' is not floating point; no aggregation rule for it")
    return np.concatenate([np.asarray(v).ravel() for v in state.values()])


def unflatten_state(vector: np.ndarray, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of `flatten_state` with the names, shapes and dtypes of `like`."""
    out, start = {}, 0
    for name, value in like.items():
        value = np.asarray(value)
        piece = vector[start : start + value.size].reshape(value.shape)
        out[name] = piece.astype(value.dtype, copy=False)
        start += value.size
    if start != vector.size:
        raise ValueError(f"vector has {vector.size} entries, the state {start}")
    return out
