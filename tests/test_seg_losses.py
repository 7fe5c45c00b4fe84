"""Per-sample losses: one value per image, independent of the other images of the batch."""

from __future__ import annotations

import math

import pytest
import torch

from dpmed.seg.losses import edge_target, per_sample_loss, soft_dice_per_image


def test_loss_of_one_image_does_not_depend_on_the_batch():
    torch.manual_seed(0)
    logits, masks = torch.randn(4, 3, 8, 8), torch.randint(0, 3, (4, 8, 8))
    full = per_sample_loss([logits, logits * 2], masks)
    assert full.shape == (4,)
    for i in range(4):
        alone = per_sample_loss([logits[i : i + 1], logits[i : i + 1] * 2], masks[i : i + 1])
        torch.testing.assert_close(full[i], alone[0])


def test_loss_closed_form_for_uniform_logits():
    masks = torch.zeros(1, 4, 4, dtype=torch.long)
    masks[0, :2] = 1
    logits = torch.zeros(1, 2, 4, 4)  # p = 0.5 everywhere
    ce = math.log(2)
    # Dice per class: (2·0.5·8 + 1)/(8 + 8 + 1) = 9/17 for both classes
    expected = ce + (1 - 9 / 17)
    assert float(per_sample_loss(logits, masks)[0]) == pytest.approx(expected, rel=1e-6)
    assert float(soft_dice_per_image(logits, masks)[0]) == pytest.approx(9 / 17)


def test_edge_target_marks_label_boundaries():
    masks = torch.zeros(1, 6, 6, dtype=torch.long)
    masks[0, 3:] = 1
    edges = edge_target(masks)[0, 0]
    assert edges[2].eq(1).all() and edges[3].eq(1).all()
    assert edges[0].eq(0).all() and edges[5].eq(0).all()
