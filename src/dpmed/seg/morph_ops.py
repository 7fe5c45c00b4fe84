"""DP-Morph on (B, C, H, W) class logits: grey morphology and the adaptive policy.

Dilation with a k×k ones kernel is max-pool (stride 1, padding k//2; pixels outside the image
are ignored), erosion is −max-pool(−x). Opening = dilate(erode(x)) removes small bright
artefacts, closing = erode(dilate(x)) fills gaps, `both` = closing(opening(x)).

Adaptive policy (paper 002 §3.2), on the retinal classes R = {1..7} of Duke:
  ŷ = argmax_c z; thickness t_{b,c} = (1/W) Σ_x Σ_y 1[ŷ_{b,y,x} = c] (pixels per column);
  T_thin, T_thick = quantiles q_low, q_high (linear interpolation) of {t_{b,c} : c ∈ R};
  class c with mean thickness t̄_c: t̄_c < T_thin → thin → closing; t̄_c > T_thick → thick →
  the variant's operation; otherwise intermediate → both. Other classes unchanged.
Scope "batch" (the paper): thresholds over the whole batch and t̄_c = batch mean, so one
image's operation depends on the other images of the batch (a coupling across samples, which
`dpmed.seg.privacy` labels). Scope "sample": the same rule with each image's own seven
thicknesses (quantiles over R, t̄_c = t_{b,c}), no coupling. Kernel 3×3 for adaptive.
The variants and their wildcard are in `dpmed.seg.morphology`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dpmed.seg.morphology import OPERATIONS, RETINAL_CLASSES, MorphSpec


def dilate(x: torch.Tensor, k: int) -> torch.Tensor:
    """Grey dilation: max over the k×k neighbourhood inside the image."""
    return F.max_pool2d(x, k, stride=1, padding=k // 2)


def erode(x: torch.Tensor, k: int) -> torch.Tensor:
    """Grey erosion: min over the k×k neighbourhood inside the image."""
    return -F.max_pool2d(-x, k, stride=1, padding=k // 2)


def opening(x: torch.Tensor, k: int) -> torch.Tensor:
    return dilate(erode(x, k), k)


def closing(x: torch.Tensor, k: int) -> torch.Tensor:
    return erode(dilate(x, k), k)


def both(x: torch.Tensor, k: int) -> torch.Tensor:
    """Opening followed by closing."""
    return closing(opening(x, k), k)


APPLY = {"open": opening, "close": closing, "both": both}


def thickness(logits: torch.Tensor) -> torch.Tensor:
    """t_{b,c}: pixels of predicted class c per column, averaged over columns; (B, C)."""
    pred = logits.detach().argmax(dim=1)
    onehot = F.one_hot(pred, logits.shape[1]).to(logits.dtype)  # B,H,W,C
    return onehot.sum(dim=1).mean(dim=1)


@dataclass(frozen=True)
class Assignment:
    """Operation per (image, class): codes index OPERATIONS, −1 = unchanged. Thresholds are
    per image (scope sample) or repeated per image (scope batch)."""

    codes: torch.Tensor  # (B, C) int64
    thickness: torch.Tensor  # (B, C) t_{b,c}
    t_thin: torch.Tensor  # (B,)
    t_thick: torch.Tensor  # (B,)


def assign(
    thick: torch.Tensor,
    thick_operation: str,
    quantiles: tuple[float, float],
    scope: str = "batch",
    classes: tuple[int, ...] = RETINAL_CLASSES,
) -> Assignment:
    """The adaptive policy on a (B, C) thickness matrix (module docstring).

    Args:
        thick: t_{b,c} from `thickness`.
        thick_operation: the operation of thick layers (the variant's: v1 open, v2 both, v3
            close).
        quantiles: (q_low, q_high) in percent.
        scope: `batch` (thresholds and t̄_c over the batch) or `sample` (per image).
        classes: the classes the policy measures and transforms.
    """
    b, c = thick.shape
    idx = list(classes)
    q = torch.tensor([quantiles[0] / 100, quantiles[1] / 100], dtype=thick.dtype)
    retinal = thick[:, idx]
    if scope == "batch":
        lo, hi = torch.quantile(retinal.reshape(-1), q.to(thick.device))
        ref = retinal.mean(dim=0, keepdim=True).expand(b, -1)
        t_thin, t_thick = lo.expand(b), hi.expand(b)
    else:
        bounds = torch.quantile(retinal, q.to(thick.device), dim=1)  # (2, B)
        t_thin, t_thick = bounds[0], bounds[1]
        ref = retinal
    code_thin = OPERATIONS.index("close")
    code_mid = OPERATIONS.index("both")
    code_thick = OPERATIONS.index(thick_operation)
    codes_r = torch.full_like(ref, code_mid, dtype=torch.long)
    codes_r = torch.where(ref < t_thin[:, None], code_thin, codes_r)
    codes_r = torch.where(ref > t_thick[:, None], code_thick, codes_r)
    codes = torch.full((b, c), -1, dtype=torch.long, device=thick.device)
    codes[:, idx] = codes_r
    return Assignment(codes, thick, t_thin, t_thick)


def apply_morph(
    spec: MorphSpec, logits: torch.Tensor, assignment: Assignment | None = None
) -> tuple[torch.Tensor, Assignment | None]:
    """DP-Morph of (B, C, H, W) logits; for adaptive, the assignment used (computed from
    `logits` unless given, e.g. from the final map for the deep-supervision side maps)."""
    if spec.kind == "none":
        return logits, None
    if spec.kind == "fixed":
        return APPLY[spec.op](logits, spec.k), None
    if assignment is None:
        assignment = assign(thickness(logits), spec.op, spec.quantiles, spec.scope)
    out = logits
    codes = assignment.codes[:, :, None, None]
    for code, name in enumerate(OPERATIONS):
        if bool((assignment.codes == code).any()):
            out = torch.where(codes == code, APPLY[name](logits, spec.k), out)
    return out, assignment
