"""Evaluation of a seg model on a split: DP-Morph applied to the logits as in training, then
Dice/HD95/MAE per class (`dpmed.metrics.segmentation`) and, for COVID CT, S_α and mean E_φ on
the foreground probability 1 − p_background (`dpmed.metrics.structure`). Images are evaluated
in fixed, unshuffled batches, so adaptive DP-Morph with batch scope sees the same batches on
every evaluation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dpmed.metrics.segmentation import SegmentationScores
from dpmed.metrics.structure import mean_e_measure, s_measure
from dpmed.seg.data import Split
from dpmed.seg.losses import split_output
from dpmed.seg.morph_ops import Assignment, apply_morph
from dpmed.seg.morphology import MorphSpec


def morph_output(spec: MorphSpec, output: object) -> tuple[object, Assignment | None]:
    """Apply DP-Morph to every class-logit map of a model output (same structure back)."""
    maps, edge = split_output(output)
    final, assignment = apply_morph(spec, maps[0])
    out_maps = [final] + [apply_morph(spec, m, assignment)[0] for m in maps[1:]]
    if isinstance(output, dict):
        return {"seg": out_maps, "edge": edge}, assignment
    if isinstance(output, (list, tuple)):
        return out_maps, assignment
    return final, assignment


def evaluate(
    net: torch.nn.Module,
    spec: MorphSpec,
    split: Split,
    classes: tuple[int, ...],
    batch_size: int,
    device: torch.device,
    hd95: bool = True,
    structure: bool = False,
) -> dict[str, Any]:
    """Dice/HD95/MAE (and S_α, E_φ on the foreground probability) of `net` on `split`."""
    scores = SegmentationScores(classes, hd95=hd95)
    s_values, e_values = [], []
    was_training = net.training
    net.eval()
    with torch.no_grad():
        for start in range(0, len(split), batch_size):
            x = split.images[start : start + batch_size].to(device)
            y = split.masks[start : start + batch_size]
            logits, _ = morph_output(spec, net(x))
            probs = logits.softmax(dim=1).cpu().numpy().astype(np.float64)
            gt = y.numpy()
            scores.update(probs, gt)
            if structure:
                for p, g in zip(probs, gt, strict=True):
                    fg = 1.0 - p[0]
                    s_values.append(s_measure(fg, g > 0))
                    e_values.append(mean_e_measure(fg, g > 0))
    net.train(was_training)
    out = scores.summary()
    if structure:
        out["s_alpha"] = float(np.mean(s_values))
        out["e_phi"] = float(np.mean(e_values))
    return out
