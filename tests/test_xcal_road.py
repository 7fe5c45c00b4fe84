"""ROAD as paper 001 reports it: the MoRF confidence drop in %, on a model whose confidence is
known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from dpmed.explain.road import confidence_drop, random_attributions, road

SIZE = 10
REGION = 40  # the first four rows: the pixels the attribution ranks highest
# Class-0 confidence of each image: offset + scale × (fraction of the region left unchanged).
OFFSET, SCALE = np.array([0.1, 0.5]), np.array([0.8, 0.2])


def _known_model():
    """Two images with distinct pixel values and a stub classifier whose class-0 softmax
    probability falls linearly with the number of region pixels that differ from the original
    (imputed values never equal the originals). Base confidences 0.9 and 0.7 (class 0)."""
    images = np.random.default_rng(0).random((2, 1, SIZE, SIZE))
    flat = np.arange(SIZE * SIZE, dtype=float).reshape(SIZE, SIZE)
    attribution = np.where(flat < REGION, 10.0 + flat / 100, flat / 100)  # region on top
    attributions = np.stack([attribution, attribution])

    def predict(batch: np.ndarray) -> np.ndarray:
        kept = (batch[:, 0] == images[:, 0]).reshape(2, -1)[:, :REGION].mean(axis=1)
        p0 = OFFSET + SCALE * kept
        return np.stack([p0, 1 - p0], axis=1)

    return predict, images, attributions


def test_road_is_the_relative_drop_of_the_mean_confidence_when_the_top_pixels_go():
    predict, images, attributions = _known_model()
    result = road(predict, images, attributions, [0.2, 0.4], seed=0)
    # MoRF removes 20 then 40 region pixels: kept 1/2 then 0 → confidences (0.5, 0.6), (0.1, 0.5);
    # LeRF removes pixels outside the region only → confidences stay (0.9, 0.7).
    base = (0.9 + 0.7) / 2
    morf = [(0.5 + 0.6) / 2, (0.1 + 0.5) / 2]
    assert result["base"] == pytest.approx(base)
    np.testing.assert_allclose(result["morf"], morf)
    np.testing.assert_allclose(result["lerf"], [base, base])
    drops = [100 * (base - c) / base for c in morf]  # 31.25 %, 62.5 %
    np.testing.assert_allclose(result["morf_drop"], drops)
    np.testing.assert_allclose(result["lerf_drop"], [0.0, 0.0], atol=1e-12)
    assert result["road"] == pytest.approx(46.875)
    assert result["combined"] == pytest.approx((base - np.mean(morf)) / 2)
    assert result["percentages"] == [0.2, 0.4]


def test_confidence_drop_is_relative_and_signed():
    assert confidence_drop(0.8, [0.2, 0.8, 1.0]) == pytest.approx([75.0, 0.0, -25.0])


def test_random_attributions_are_the_baseline_an_informative_ranking_beats():
    """On the known model, removing the region first (the informative ranking) drops the
    confidence more than removing random pixels; random maps are seeded and uniform."""
    predict, images, attributions = _known_model()
    maps = random_attributions(attributions.shape, seed=3)
    assert np.array_equal(maps, random_attributions(attributions.shape, seed=3))
    assert maps.shape == attributions.shape and 0 <= maps.min() and maps.max() < 1
    informed = road(predict, images, attributions, [0.2, 0.4], seed=0)
    baseline = road(predict, images, maps, [0.2, 0.4], seed=0)
    # random removal hits the 40-pixel region in ~40 % of its picks: drop ≈ 0.4 × informed
    assert 0 < baseline["road"] < 0.8 * informed["road"]
