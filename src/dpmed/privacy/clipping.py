"""Per-sample gradient scale factors of the four DP-SGD clipping rules (paper 002, Table 1).

With n_i = ‖g_i‖₂ over all parameters, the summed update is Σ_i s(n_i)·g_i. Every rule keeps
n·s(n) ≤ C, so the L2 sensitivity of the sum is C and Opacus' noise std σ·C is correct for all
(REFERENCE.md §2; unlike the public implementations, flaw 7):

    flat   min(1, C/n)                 (Abadi et al.)
    autos  C/(n + γ)                   (Auto-S, γ = 0.01)
    nsgd   C/(n + r)                   (normalised SGD, r = 0.1)
    psac   C/(n + r/(n + r))           (per-sample adaptive clipping, r = 0.1)
    none   1                           (no clipping: unbounded sensitivity, non-private only)

NSGD and Auto-S in their papers drop the factor C (it is folded into the learning rate); here
it is kept so that one σ·C noise scale serves every rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RULES = ("none", "flat", "nsgd", "autos", "psac")
PRIVATE_RULES = RULES[1:]


@dataclass(frozen=True)
class ClipRule:
    """A clipping rule with its constants: C (clip_norm), γ (autos_gamma), r (nsgd/psac)."""

    name: str
    clip_norm: float = 1.0
    gamma: float = 0.01
    r: float = 0.1

    def __post_init__(self) -> None:
        if self.name not in RULES:
            raise ValueError(f"unknown clip rule '{self.name}' (known: {', '.join(RULES)})")
        if self.clip_norm <= 0 or self.gamma <= 0 or self.r <= 0:
            raise ValueError("clip_norm, gamma and r must be positive")

    @property
    def bounded(self) -> bool:
        """Whether every scaled per-sample gradient has norm ≤ clip_norm."""
        return self.name != "none"

    def factors(self, norms: torch.Tensor) -> torch.Tensor:
        """Scale factor s(n) per sample for per-sample gradient norms `norms` (shape [B])."""
        c = self.clip_norm
        if self.name == "none":
            return torch.ones_like(norms)
        if self.name == "flat":
            safe = torch.where(norms > c, norms, torch.full_like(norms, c))
            return c / safe
        if self.name == "autos":
            return c / (norms + self.gamma)
        if self.name == "nsgd":
            return c / (norms + self.r)
        return c / (norms + self.r / (norms + self.r))
