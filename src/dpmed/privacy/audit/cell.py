"""What every audited cell shares: the audit record (`CellAudit`), the settings check, the Dirac
canary norm a clip rule lets through largest, and the audit's seeded generators."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from dpmed.privacy.audit.bound import AuditResult
from dpmed.runtime import JobContext
from dpmed.seeding import stable_seed

# Canary norms tried, in units of C: a rule whose n·s(n) grows with n (NSGD, AUTO-S, PSAC)
# lets a larger gradient through larger, up to C.
NORM_MULTIPLES = (1.0, 10.0, 100.0, 1000.0)


@dataclass(frozen=True)
class CellAudit:
    """The audit of one cell: what ran, what it claims and what the canaries measured.

    Args:
        study: `seg`, `xcal` or `fets`.
        mechanism: the cell's mechanism (seg: `clip/morph`, xcal: the method, fets:
            `aggregator/dpmode`).
        setting: the canaries (`gradient`, `input`, `paper-noise`, `update`: the study's
            `StudySpec.audit_settings`).
        guarantee: the run's privacy record's guarantee (`dp`, `paper-approximation`).
        eps_claimed: the record's ε at `result.delta`, for the calibrated σ.
        noise_scale: the factor on the noise std actually added (1: as configured).
        canary_norm: the canaries' gradient or update norm (None for input canaries).
        wildcards: the cell.
        result: the one-run audit.
    """

    study: str
    mechanism: str
    setting: str
    guarantee: str
    eps_claimed: float
    noise_scale: float
    canary_norm: float | None
    wildcards: dict[str, str]
    result: AuditResult

    def record(self) -> dict[str, Any]:
        """audit.json's content: the fields above with the result's flattened in."""
        fields = {k: v for k, v in asdict(self).items() if k != "result"}
        return fields | asdict(self.result)


def require_setting(study: str, setting: str, offered: tuple[str, ...]) -> None:
    """Raise ValueError unless `setting` is among the settings `offered` by `study`'s audit."""
    if setting not in offered:
        raise ValueError(f"no audit setting {setting!r} for study {study!r} (it offers {offered})")


def canary_norm(factors: Callable[[torch.Tensor], torch.Tensor], clip_norm: float) -> float:
    """The gradient norm n among `NORM_MULTIPLES`·C whose scaled norm n·s(n) is largest (the
    smallest such n on ties): the strongest Dirac canary the rule lets through."""
    norms = torch.tensor(NORM_MULTIPLES, dtype=torch.float64) * clip_norm
    scaled = norms * factors(norms)
    return float(norms[int(torch.argmax(scaled))])


def audit_generator(job: JobContext, *parts: object) -> torch.Generator:
    """A CPU generator seeded by (job seed, "privacy-audit", *parts)."""
    return torch.Generator().manual_seed(stable_seed(job.seed, "privacy-audit", *parts))
