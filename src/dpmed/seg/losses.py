"""Per-sample segmentation losses: one value per image, no coupling across the batch.

loss_i = mean over the supervised maps m of [CE_i(m) + w·(1 − SoftDice_i(m))] (+ BCE_i(edge)
for Inf-Net), where CE_i is the pixel mean of the cross-entropy of image i, SoftDice_i the mean
over classes c of (2 Σ p_c g_c + 1)/(Σ p_c + Σ g_c + 1) over the pixels of image i (p =
softmax, g = one-hot label; the +1 smoothing makes a class absent from both count as 1), and
the edge target is the label boundary (a pixel whose 3×3 neighbourhood holds another class).
Deep supervision averages the losses of every map. The returned tensor has shape [B]: DP-SGD
needs one loss per image, so that one image changes only its own per-sample gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def split_output(output: object) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """(list of class-logit maps, finest first; edge logits or None) from a model output."""
    if isinstance(output, torch.Tensor):
        return [output], None
    if isinstance(output, dict):
        return list(output["seg"]), output.get("edge")
    if isinstance(output, (list, tuple)):
        return list(output), None
    raise TypeError(f"unsupported model output {type(output)}")


def soft_dice_per_image(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Mean over classes of the smoothed soft Dice of each image → [B]."""
    probs = logits.softmax(dim=1)
    onehot = F.one_hot(masks, logits.shape[1]).permute(0, 3, 1, 2).to(probs.dtype)
    inter = (probs * onehot).flatten(2).sum(dim=2)
    denom = probs.flatten(2).sum(dim=2) + onehot.flatten(2).sum(dim=2)
    return ((2 * inter + 1) / (denom + 1)).mean(dim=1)


def edge_target(masks: torch.Tensor) -> torch.Tensor:
    """1 where the 3×3 neighbourhood of a pixel holds more than one class; (B,1,H,W) float."""
    m = masks[:, None].float()
    hi = F.max_pool2d(m, 3, stride=1, padding=1)
    lo = -F.max_pool2d(-m, 3, stride=1, padding=1)
    return (hi != lo).float()


def per_sample_loss(output: object, masks: torch.Tensor, dice_weight: float = 1.0) -> torch.Tensor:
    """The per-image training loss [B] of a model output (tensor, deep-supervision list or
    Inf-Net dict) against integer masks (B,H,W)."""
    maps, edge = split_output(output)
    total = torch.zeros(masks.shape[0], dtype=maps[0].dtype, device=masks.device)
    for logits in maps:
        # pixel-mean cross-entropy of each image
        total = total + F.cross_entropy(logits, masks, reduction="none").flatten(1).mean(dim=1)
        if dice_weight:
            total = total + dice_weight * (1.0 - soft_dice_per_image(logits, masks))
    total = total / len(maps)
    if edge is not None:
        bce = F.binary_cross_entropy_with_logits(edge, edge_target(masks), reduction="none")
        total = total + bce.flatten(1).mean(dim=1)
    return total
