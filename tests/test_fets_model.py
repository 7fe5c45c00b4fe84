"""3D residual U-Net: size of the paper model, Opacus-validity, no buffers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from opacus.validators import ModuleValidator

from dpmed.fets.patches import ClassIndex, predict_volume, sample_patch, to_classes
from dpmed.models.resunet3d import ResUNet3d, count_parameters


def test_paper_model_has_about_33m_parameters():
    with torch.device("meta"):
        model = ResUNet3d(4, 4, base_filters=32, depth=4)
    assert 30e6 < count_parameters(model) < 38e6


@pytest.mark.parametrize("norm", ["group", "instance"])
def test_tiny_model_is_opacus_valid_and_has_no_buffers(norm):
    model = ResUNet3d(4, 4, base_filters=4, depth=2, norm=norm)
    assert ModuleValidator.validate(model, strict=False) == []
    assert list(model.buffers()) == []
    assert not any(getattr(m, "inplace", False) for m in model.modules())
    out = model(torch.randn(2, 4, 16, 16, 8))
    assert out.shape == (2, 4, 16, 16, 8)


def test_label_aware_patch_is_centred_on_a_voxel_of_the_chosen_class():
    label = np.zeros((20, 20, 12), dtype=np.uint8)
    label[15:18, 2:4, 9:11] = 4
    image = np.stack([np.arange(label.size, dtype=np.float16).reshape(label.shape)] * 4)
    index = ClassIndex(label)
    assert index.present == [0, 4]
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(40):
        img, lab = sample_patch(image, label, index, (8, 8, 8), rng)
        assert img.shape == (4, 8, 8, 8) and lab.shape == (8, 8, 8)
        hits += bool((lab == 3).any())
    assert 5 < hits < 40  # about half of the patches are drawn around the tumour class
    small = sample_patch(image[:, :4, :4, :4], label[:4, :4, :4], ClassIndex(label[:4, :4, :4]),
                         (8, 8, 8), rng)  # fmt: skip
    assert small[0].shape == (4, 8, 8, 8) and small[0][:, 4:].sum() == 0


def test_tiled_prediction_covers_the_volume():
    image = np.random.default_rng(0).standard_normal((4, 10, 9, 7)).astype(np.float32)

    def predict(x: torch.Tensor) -> torch.Tensor:  # class = 1 where channel 0 > 0
        return torch.stack([-x[:, 0], x[:, 0], x[:, 0] * 0 - 9, x[:, 0] * 0 - 9], dim=1)

    for tiles_per_batch in (1, 5, 64):  # 3 x 3 x 2 tiles: one, several and a partial batch
        got = predict_volume(predict, image, (4, 4, 4), torch.device("cpu"), tiles_per_batch)
        assert np.array_equal(got, (image[0] > 0).astype(np.int64))
    assert to_classes(np.array([0, 1, 2, 4])).tolist() == [0, 1, 2, 3]


def test_batched_tiles_give_the_tile_by_tile_prediction_of_a_real_network():
    """GroupNorm normalises each tile on its own, so predicting tiles in batches must give the
    class map of predicting them one at a time (a plain loop over tiles, computed here)."""
    torch.manual_seed(0)
    model = ResUNet3d(4, 4, base_filters=4, depth=2).eval()
    image = np.random.default_rng(1).standard_normal((4, 16, 8, 12)).astype(np.float32)
    expected = np.zeros((16, 8, 16), dtype=np.int64)
    padded = np.zeros((4, 16, 8, 16), dtype=np.float32)
    padded[:, :, :, :12] = image
    with torch.no_grad():
        for x in (0, 8):
            for z in (0, 8):
                tile = torch.from_numpy(padded[None, :, x : x + 8, :, z : z + 8])
                expected[x : x + 8, :, z : z + 8] = model(tile).argmax(1)[0].numpy()
    got = predict_volume(model, image, (8, 8, 8), torch.device("cpu"), tiles_per_batch=3)
    assert np.array_equal(got, expected[:, :, :12])
