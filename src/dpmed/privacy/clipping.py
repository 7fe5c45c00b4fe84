"""Per-sample gradient scale factors of the four DP-SGD clipping rules (paper 002, Table 1).

With n_i = ‖g_i‖₂ over all parameters, the summed update is Σ_i s(n_i)·g_i. Every rule keeps
n·s(n) ≤ C, so the L2 sensitivity of the sum is C and Opacus' noise std σ·C is correct for all
(REFERENCE.md §2; unlike the public implementations, flaw 7). `RULE_INFO` states each s(n) as
text next to `ClipRule.factors` (the source of the generated Table 1); `none` (s = 1, unbounded
sensitivity) is for non-private runs only.

NSGD and Auto-S in their papers drop the factor C (it is folded into the learning rate); here
it is kept so that one σ·C noise scale serves every rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RULES = ("none", "flat", "nsgd", "autos", "psac")
PRIVATE_RULES = RULES[1:]
SYMBOLS = {"C": "clip_norm", "γ": "gamma", "r": "r"}  # formula symbol → ClipRule field


@dataclass(frozen=True)
class RuleInfo:
    """What paper 002 Table 1 says about a rule, plus the factor this code implements.

    factor: s(n) as a Python expression in n and the `SYMBOLS` (min allowed), evaluable;
    hard_clip: whether n·s(n) reaches exactly C (a min) rather than staying below it (smooth);
    constants: the symbols s(n) uses besides C; paper_mechanism: the paper's column.
    """

    label: str
    factor: str
    hard_clip: bool
    constants: tuple[str, ...]
    paper_mechanism: str
    limitation: str
    reference: str


RULE_INFO: dict[str, RuleInfo] = {
    "none": RuleInfo(
        "Non-private", "1", False, (), "g_i", "no privacy (unbounded sensitivity)", "—"
    ),
    "flat": RuleInfo(
        "Flat",
        "min(1, C/n)",
        True,
        (),
        "min(1, C/‖g_i‖)",
        "loss of magnitude information; requires tuning of C",
        "Abadi et al., CCS 2016",
    ),
    "nsgd": RuleInfo(
        "NSGD",
        "C/(n + r)",
        False,
        ("r",),
        "g_i/(r + ‖g_i‖)",
        "deviation from true batch gradient; depends on r",
        "Yang et al., normalised SGD with perturbation, 2022",
    ),
    "autos": RuleInfo(
        "AUTO-S",
        "C/(n + γ)",
        False,
        ("γ",),
        "g_i/(‖g_i‖ + γ)",
        "deviation from true batch gradient under small or imbalanced norms",
        "Bu et al., automatic clipping, NeurIPS 2023",
    ),
    "psac": RuleInfo(
        "PSAC",
        "C/(n + r/(n + r))",
        False,
        ("r",),
        "C·g_i/(‖g_i‖ + r/(‖g_i‖ + r))",
        "additional design complexity due to norm-dependent scaling",
        "Xia et al., per-sample adaptive clipping, AAAI 2023",
    ),
}


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
