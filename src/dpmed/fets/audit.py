"""Audits of private fets cells with canary collaborator updates (setting `update`;
`dpmed.audit`).

The fets guarantee is collaborator-level with replace-one adjacency: neighbouring rounds differ
in one chosen collaborator's model tensors. Each of the m canaries is one more collaborator of
every round, its update a Dirac of the clip norm C on its own coordinate c_j of the flattened
model: w + C·e_{c_j} when included (probability ½), w − C·e_{c_j} when not. The two are
replace-one neighbours (updates of norm C, the worst-case pair 2C apart that the sound modes'
Δf covers), so the bound of Steinke et al. applies canary by canary, and the sound modes'
released models are (ε, δ)-DP in each canary's bit. The canaries' data-size weight is the mean
of the round's chosen collaborators'; they join every round, the worst case for the claim,
which composes over all T rounds without sampling. Score: ⟨e_{c_j}, w_T − w_0⟩ on the released
global model.

The rounds are `dpmed.fets.run`'s (`prepare`, `aggregate_round`: the real local
training and the real `Server` with the cell's aggregator and DP mode); validation, timing and
checkpoints are skipped. Paper mode runs as it is (per-tensor clipping of the full weights,
similarity weights, the empirical Δf), audited against the T·ε0 it claims. `noise_scale`
multiplies every noise draw (the claim unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from dpmed.fets import privacy
from dpmed.fets import run as fets_run
from dpmed.fets.aggregation import DP_MODES, flatten_state
from dpmed.fets.collaborator import state_to_numpy
from dpmed.fets.server import Local, Server, ServerConfig
from dpmed.fets.spec import SPEC
from dpmed.privacy.audit.bound import best_audit
from dpmed.privacy.audit.cell import CellAudit, audit_generator, require_setting
from dpmed.runtime import JobContext

if TYPE_CHECKING:
    from dpmed.privacy.normals import NormalSource


@dataclass(frozen=True)
class UpdateCanaries:
    """m canary collaborators over the flattened global model.

    Args:
        coordinates: (m,) distinct flat indices c_j (key order of the state dict).
        included: (m,) bool: canary j sends +C·e_{c_j} (True) or −C·e_{c_j} (False).
        norm: C, each canary update's norm.
    """

    coordinates: np.ndarray
    included: np.ndarray
    norm: float

    @classmethod
    def draw(
        cls, total: int, count: int, norm: float, generator: torch.Generator
    ) -> UpdateCanaries:
        """`count` canaries on distinct coordinates of a `total`-entry model, each included
        independently with probability ½ (both from `generator`)."""
        if not 0 < count <= total:
            raise ValueError(f"need 0 < count <= {total} parameters, got {count}")
        if norm <= 0:
            raise ValueError(f"need a positive canary norm, got {norm}")
        coordinates = torch.randperm(total, generator=generator)[:count].numpy()
        included = (torch.rand(count, generator=generator) < 0.5).numpy()
        return cls(coordinates, included, float(norm))

    def locals(self, state: Mapping[str, np.ndarray], weight: float) -> list[Local]:
        """The canaries' (name, local state, weight) triples for a round from global `state`:
        the state with ±C added at c_j (only that tensor copied)."""
        names = list(state)
        ends = np.cumsum([np.asarray(state[n]).size for n in names])
        which = np.searchsorted(ends, self.coordinates, side="right")
        out: list[Local] = []
        for j, (coordinate, k) in enumerate(zip(self.coordinates, which, strict=True)):
            start = int(ends[k] - np.asarray(state[names[k]]).size)
            tensor = np.array(state[names[k]], copy=True)
            sign = 1.0 if self.included[j] else -1.0
            tensor.reshape(-1)[int(coordinate) - start] += tensor.dtype.type(sign * self.norm)
            out.append((f"canary-{j}", {**state, names[k]: tensor}, weight))
        return out

    def scores(self, before: np.ndarray, after: np.ndarray) -> np.ndarray:
        """⟨e_{c_j}, w_T − w_0⟩ per canary, float64 (m,), from the flattened global models."""
        delta = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
        return delta[self.coordinates]


class AuditServer(Server):
    """The cell's `Server` with every noise draw scaled by `noise_scale`."""

    def __init__(self, cfg: ServerConfig, noise_scale: float) -> None:
        super().__init__(cfg)
        self.noise_scale = noise_scale

    def generator(self, fl_round: int) -> NormalSource:
        return super().generator(fl_round).scaled(self.noise_scale)


def audit_cell(
    job: JobContext,
    setting: str,
    canaries: int,
    confidence: float = 0.95,
    noise_scale: float = 1.0,
) -> CellAudit:
    """Run the private fets cell of `job` with `canaries` canary collaborators and audit it."""
    require_setting("fets", setting, SPEC.audit_settings)
    if not DP_MODES[job.wildcards["dpmode"]].private:
        raise ValueError(f"fets cell {job.wildcards} is not private: nothing to audit")
    prepared = fets_run.prepare(job)
    cfg, federation = prepared.server, prepared.federation
    state = state_to_numpy(federation.model)
    before = flatten_state(state)
    updates = UpdateCanaries.draw(
        before.size, canaries, cfg.clip_norm, audit_generator(job, "update")
    )
    server = AuditServer(cfg, noise_scale)
    rounds, mech = int(job.params["rounds"]), None
    for fl_round in range(1, rounds + 1):
        chosen = [str(c) for c in federation.choices[fl_round - 1].collaborators]
        weight = float(np.mean([federation.collaborators[n].n_train for n in chosen]))
        extra = updates.locals(state, weight)
        state, mech = fets_run.aggregate_round(federation, server, state, chosen, fl_round, extra)
    record = privacy.privacy_record(cfg, rounds, privacy.round_columns(cfg, rounds, mech))
    scores = updates.scores(before, flatten_state(state))
    wc = dict(job.wildcards)
    return CellAudit(
        "fets",
        f"{cfg.aggregator}/{cfg.dpmode}",
        setting,
        record.guarantee,
        float(record.epsilon),
        noise_scale,
        cfg.clip_norm,
        wc,
        best_audit(scores, updates.included, confidence, record.delta),
    )
