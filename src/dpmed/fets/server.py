"""The fets server: turns one round's local tensors into the next global model with the run's
aggregation rule wrapped by its DP mode (`dpmed.fets.aggregation`, configured by its
`ServerConfig`), and reports the mechanisms it applied.

`Server.aggregate` receives only (collaborator name, state dict of numpy tensors, data-size
weight) triples and the current global state. Before any rule sees the round, `screen_round`
checks it, in the one place the simulation and the OpenFL adapter share: a malformed or
non-finite update counts as a zero update (docs/privacy.md, "One bad collaborator"), and an
aggregate with a non-finite entry is never returned (`check_model`).

With a seed (the simulation passes its job seed) noise is drawn from
`stable_seed("fets-noise", seed, round)`, so a resumed run draws the same noise as an
uninterrupted one; without one (a deployment) every round's noise comes from fresh OS entropy,
so nobody can regenerate and subtract it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dpmed.fets.aggregation import RoundMechanisms, ScreenedRound, ServerConfig
from dpmed.fets.aggregators import normalised_weights
from dpmed.fets.round_tensors import RoundTensors, TensorGroup
from dpmed.privacy import mechanisms
from dpmed.privacy.normals import NormalSource
from dpmed.seeding import stable_seed


@dataclass(frozen=True)
class Rejection:
    """A collaborator update the server refused, and why: the first tensor missing, extra or
    of another shape than the global model's, else the first with a non-finite entry, else the
    tensor of largest norm of an update beyond `MAX_UPDATE_NORM`."""

    collaborator: str
    tensor: str
    reason: str


Local = tuple[str, Mapping[str, np.ndarray], float]
logger = logging.getLogger(__name__)

# The largest L2 norm of a collaborator's whole-model update (and of a global model) the server
# aggregates: far beyond any trained network's, and small enough that no float64 norm, Gram
# entry or weighted sum of a screened round can overflow (entries of the Gram matrix of
# updates within it stay below 1e201). A norm whose square overflows float64 is beyond it too.
MAX_UPDATE_NORM = 1e100


def _fault(
    sq_norms: np.ndarray, state: Mapping[str, np.ndarray], names: Sequence[str]
) -> tuple[str, str] | None:
    """(tensor, reason) when the vector with per-tensor squared norms `sq_norms` (over `names`,
    float64, NaN or infinite when an entry is) has a non-finite entry or a norm beyond
    `MAX_UPDATE_NORM`; None when it passes. `state` holds its tensors, to name the culprit."""
    total = float(np.sum(sq_norms))
    if math.isfinite(total) and math.sqrt(total) <= MAX_UPDATE_NORM:
        return None
    for name in names:
        if not np.all(np.isfinite(state[name])):
            return name, "non-finite entries"
    worst = names[int(np.argmax(sq_norms))]
    return worst, f"norm {math.sqrt(total):.3g} beyond the limit {MAX_UPDATE_NORM:.0e}"


def check_model(state: Mapping[str, np.ndarray], what: str) -> None:
    """Raise, naming the tensor, when a global model (received or about to be released) has a
    non-finite entry or a norm beyond `MAX_UPDATE_NORM`: it is never aggregated or released."""
    model = RoundTensors({name: TensorGroup.of([value]) for name, value in state.items()})
    found = _fault(model.sq_norms[0], state, list(state))
    if found is not None:
        raise ValueError(f"{what}: tensor {found[0]!r} has {found[1]}; refused")


def _malformed(
    state: Mapping[str, np.ndarray], global_state: Mapping[str, np.ndarray]
) -> tuple[str, str] | None:
    """(tensor, reason) when `state` lacks a tensor of `global_state`, holds one of another
    shape or one the global model lacks; None when its tensors match the global model's."""
    for name, value in global_state.items():
        if name not in state:
            return name, "missing from the update"
        if np.shape(state[name]) != np.shape(value):
            return name, f"shape {np.shape(state[name])}, expected {np.shape(value)}"
    extra = sorted(set(state) - set(global_state))
    return (extra[0], "not in the global model") if extra else None


def screen_round(
    global_state: Mapping[str, np.ndarray], local: Sequence[Local], fl_round: int
) -> ScreenedRound:
    """Check one round before any rule uses it (the simulation's server and the OpenFL
    adapter both call this). Raises on 0 collaborators, on weights that are not finite, ≥ 0
    and of positive sum, and on a global model that fails `check_model`. Rejects, with a
    warning naming the collaborator and the tensor, each update that is malformed
    (`_malformed`) or whose u_i = w_i − w_global has a non-finite entry or ‖u_i‖ >
    `MAX_UPDATE_NORM` (float64 norms, `RoundTensors.sq_norms`): it is replaced by the zero
    update and keeps its weight and its place in the count."""
    weights = normalised_weights([w for _, _, w in local])
    check_model(global_state, f"round {fl_round}: the global model")
    faults = [_malformed(state, global_state) for _, state, _ in local]
    states = [global_state if f else state for f, (_, state, _) in zip(faults, local, strict=True)]
    updates = RoundTensors.updates(global_state, states)
    names = list(global_state)
    for i, sq in enumerate(updates.sq_norms):
        faults[i] = faults[i] or _fault(sq, states[i], names)
    rejected = tuple(Rejection(c, *f) for f, (c, _, _) in zip(faults, local, strict=True) if f)
    for r in rejected:
        logger.warning(
            "round %d: rejected the update of collaborator %r (tensor %r: %s); it counts as a "
            "zero update (the global model unchanged)", fl_round, r.collaborator, r.tensor,
            r.reason,
        )  # fmt: skip
    screened = [(c, global_state if f else state, float(w))
                for f, (c, state, _), w in zip(faults, local, weights, strict=True)]  # fmt: skip
    if rejected:
        updates = RoundTensors.updates(global_state, [state for _, state, _ in screened])
    return ScreenedRound(screened, updates, rejected)


def noise_generator(seed: int | None, *stream: object) -> NormalSource:
    """The noise generator of one release: seeded by ("fets-noise", seed, *stream) when a seed
    is given (reproducible, not for deployment), else fresh OS entropy."""
    if seed is None:
        return mechanisms.secure_generator()
    return NormalSource(stable_seed("fets-noise", seed, *stream, bits=64))


class Server:
    """Aggregates rounds for one `ServerConfig`."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg

    def generator(self, fl_round: int) -> NormalSource:
        """The noise generator of round `fl_round` (`noise_generator`; a privacy audit's server
        overrides it to scale the noise, `dpmed.fets.audit`)."""
        return noise_generator(self.cfg.seed, fl_round)

    def aggregate(
        self, global_state: Mapping[str, np.ndarray], local: Sequence[Local], fl_round: int
    ) -> tuple[dict[str, np.ndarray], RoundMechanisms | None]:
        """The next global state from the round's local states (screened first,
        `screen_round`), and the round's mechanisms (None when no noise was added). Raises
        instead of returning an aggregate with a non-finite entry."""
        screened = screen_round(global_state, local, fl_round)
        out, mech = self.cfg.mode.aggregate(self.cfg, screened, self.generator(fl_round))
        check_model(out, f"round {fl_round}: the aggregate")
        return out, mech
