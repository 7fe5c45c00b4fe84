"""The DP-SGD clipping rules of paper 002 (Table 1), one registry entry per rule.

With n_i = ‖g_i‖₂ over all parameters, a rule scales each per-sample gradient by s(n_i) and the
update sums Σ_i s(n_i)·g_i. Every private rule keeps n·s(n) ≤ C, so the L2 sensitivity of the
sum is C and one noise std σ·C is correct for all of them (the public NSGD and PSAC
implementations scale their noise otherwise; `ClipEntry.paper_noise` records how). NSGD and
Auto-S drop the factor C in their papers (it is folded into the learning rate); here it is kept
so that one σ·C serves every rule. `none` (s = 1, unbounded sensitivity) is for non-private runs.

A rule is one `register_clip_rule` call: its factor s(n), Table 1 text, display label and report
positions. The config schema, the `clip` wildcard, Table 1 and the seg tables and figures read
the rules from `CLIP_RULES`. Factors use tensor methods only: this module imports without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpmed.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

SYMBOLS = {"C": "clip_norm", "γ": "gamma", "r": "r"}  # formula symbol → ClipRule field


def _same_noise(sigma: float, rule: ClipRule) -> float:
    return sigma


@dataclass(frozen=True)
class ClipEntry:
    """A registered clipping rule.

    Args:
        factor: s(n) per sample: (norms [B], the rule with its constants) → factors [B].
        label: the name tables and figures use ("AUTO-S").
        rank: position in the report order (table rows, figure axes, bar colours).
        paper_column: position among the private rules in the columns of paper 002's Table 2
            and Fig. 6 (the non-private baseline goes last in Table 2, first in Fig. 6).
        formula: s(n) as a Python expression in n and the `SYMBOLS` (min allowed): Table 1.
        hard_clip: whether n·s(n) reaches C exactly (a min) rather than staying below it.
        constants: the `SYMBOLS` s(n) uses besides C.
        paper_mechanism: the paper's mechanism column of Table 1.
        limitation: the paper's limitation column.
        reference: where the rule comes from.
        bounded: whether n·s(n) ≤ C for every n (False only for the non-private `none`).
        paper_noise: the noise multiplier the rule's public implementation used, from our
            calibrated σ and the rule; None when its noise scale is data-dependent (not DP).
        paper_flaw: why the public implementation's noise differs from σ·C ("" when it does
            not); a reason in the seg privacy table.
    """

    factor: Callable[[Tensor, ClipRule], Tensor]
    label: str
    rank: int
    paper_column: int
    formula: str
    hard_clip: bool
    constants: tuple[str, ...]
    paper_mechanism: str
    limitation: str
    reference: str
    bounded: bool = True
    paper_noise: Callable[[float, ClipRule], float] | None = _same_noise
    paper_flaw: str = ""


CLIP_RULES: Registry[ClipEntry] = Registry("clip rule")


def register_clip_rule(name: str, **entry) -> Callable:
    """Decorator registering its function s(norms, rule) as clip rule `name`; the keyword
    arguments are the other `ClipEntry` fields."""

    def decorate(factor: Callable[[Tensor, ClipRule], Tensor]) -> Callable:
        CLIP_RULES.add(name, ClipEntry(factor=factor, **entry))
        return factor

    return decorate


@register_clip_rule(
    "none",
    label="Non-private",
    rank=0,
    paper_column=0,
    formula="1",
    hard_clip=False,
    constants=(),
    paper_mechanism="g_i",
    limitation="no privacy (unbounded sensitivity)",
    reference="—",
    bounded=False,
)
def _no_clipping(norms: Tensor, rule: ClipRule) -> Tensor:
    return norms.new_ones(norms.shape)


@register_clip_rule(
    "flat",
    label="Flat",
    rank=1,
    paper_column=2,
    formula="min(1, C/n)",
    hard_clip=True,
    constants=(),
    paper_mechanism="min(1, C/‖g_i‖)",
    limitation="loss of magnitude information; requires tuning of C",
    reference="Abadi et al., CCS 2016",
)
def _flat(norms: Tensor, rule: ClipRule) -> Tensor:
    # exactly 1 where n ≤ C: C/C is not 1 on every CPU (torch may divide by a scalar as a
    # reciprocal times C, 1 - 2⁻⁵³ here), and "clipped" means s < 1
    c = rule.clip_norm
    return (c / norms).where(norms > c, norms.new_ones(norms.shape))


@register_clip_rule(
    "nsgd",
    label="NSGD",
    rank=3,
    paper_column=3,
    formula="C/(n + r)",
    hard_clip=False,
    constants=("r",),
    paper_mechanism="g_i/(r + ‖g_i‖)",
    limitation="deviation from true batch gradient; depends on r",
    reference="Yang et al., normalised SGD with perturbation, 2022",
    paper_noise=lambda sigma, rule: sigma * rule.r / rule.clip_norm,
    paper_flaw="the public NSGD implementation scales the noise by r instead of the sensitivity "
    "C: noise multiplier σ·r/C (docs/privacy.md, finding 7)",
)
def _nsgd(norms: Tensor, rule: ClipRule) -> Tensor:
    return rule.clip_norm / (norms + rule.r)


@register_clip_rule(
    "autos",
    label="AUTO-S",
    rank=2,
    paper_column=1,
    formula="C/(n + γ)",
    hard_clip=False,
    constants=("γ",),
    paper_mechanism="g_i/(‖g_i‖ + γ)",
    limitation="deviation from true batch gradient under small or imbalanced norms",
    reference="Bu et al., automatic clipping, NeurIPS 2023",
)
def _autos(norms: Tensor, rule: ClipRule) -> Tensor:
    return rule.clip_norm / (norms + rule.gamma)


@register_clip_rule(
    "psac",
    label="PSAC",
    rank=4,
    paper_column=4,
    formula="C/(n + r/(n + r))",
    hard_clip=False,
    constants=("r",),
    paper_mechanism="C·g_i/(‖g_i‖ + r/(‖g_i‖ + r))",
    limitation="additional design complexity due to norm-dependent scaling",
    reference="Xia et al., per-sample adaptive clipping, AAAI 2023",
    paper_noise=None,
    paper_flaw="not DP: data-dependent noise scale (the public PSAC implementation scales the "
    "noise by the maximum per-sample threshold of the batch; docs/privacy.md, finding 7)",
)
def _psac(norms: Tensor, rule: ClipRule) -> Tensor:
    return rule.clip_norm / (norms + rule.r / (norms + rule.r))


def private_rules() -> tuple[str, ...]:
    """The rules usable for DP-SGD (n·s(n) ≤ C), in registration order."""
    return tuple(name for name, entry in CLIP_RULES.items() if entry.bounded)


def report_order() -> tuple[str, ...]:
    """Every rule in report order (`ClipEntry.rank`)."""
    return tuple(sorted(CLIP_RULES, key=lambda name: CLIP_RULES[name].rank))


def paper_column_order(baseline_first: bool) -> tuple[str, ...]:
    """The private rules by `ClipEntry.paper_column`, the non-private ones before (Fig. 6) or
    after them (Table 2)."""
    ranked = sorted(CLIP_RULES, key=lambda name: CLIP_RULES[name].paper_column)
    private = [name for name in ranked if CLIP_RULES[name].bounded]
    baseline = [name for name in ranked if not CLIP_RULES[name].bounded]
    return tuple(baseline + private if baseline_first else private + baseline)


@dataclass(frozen=True)
class ClipRule:
    """A registered clipping rule with its constants: C (clip_norm), γ (gamma, Auto-S's
    stability constant) and r (NSGD/PSAC's regulariser)."""

    name: str
    clip_norm: float = 1.0
    gamma: float = 0.01
    r: float = 0.1

    def __post_init__(self) -> None:
        CLIP_RULES[self.name]  # an unknown name raises, listing the known ones
        if self.clip_norm <= 0 or self.gamma <= 0 or self.r <= 0:
            raise ValueError("clip_norm, gamma and r must be positive")

    @property
    def bounded(self) -> bool:
        """Whether every scaled per-sample gradient has norm ≤ clip_norm."""
        return CLIP_RULES[self.name].bounded

    def factors(self, norms: Tensor) -> Tensor:
        """Scale factor s(n) per sample for per-sample gradient norms `norms` (shape [B])."""
        return CLIP_RULES[self.name].factor(norms, self)
