"""DP-Morph: max-pool morphology equals scipy's grey filters; the adaptive policy assigns the
documented operation to thin / intermediate / thick layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage

from dpmed.seg.morph_ops import (
    apply_morph,
    assign,
    both,
    closing,
    dilate,
    erode,
    opening,
    thickness,
)
from dpmed.seg.morphology import OPERATIONS, parse_morph


def _grey(x: np.ndarray, op: str, k: int) -> np.ndarray:
    size = (1, 1, k, k)  # 'nearest' padding = neighbours outside the image ignored (max/min)
    dil = lambda a: ndimage.maximum_filter(a, size=size, mode="nearest")  # noqa: E731
    ero = lambda a: ndimage.minimum_filter(a, size=size, mode="nearest")  # noqa: E731
    return {
        "dilate": dil,
        "erode": ero,
        "open": lambda a: dil(ero(a)),
        "close": lambda a: ero(dil(a)),
        "both": lambda a: ero(dil(dil(ero(a)))),
    }[op](x)


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize(
    "op,fn",
    [("dilate", dilate), ("erode", erode), ("open", opening), ("close", closing), ("both", both)],
)
def test_morphology_equals_scipy_min_max_filters(op, fn, k):
    x = np.random.default_rng(k).normal(size=(2, 3, 11, 13))
    got = fn(torch.from_numpy(x), k).numpy()
    np.testing.assert_array_equal(got, _grey(x, op, k))


def test_parse_morph():
    assert parse_morph("none").kind == "none"
    spec = parse_morph("close-k5")
    assert (spec.kind, spec.op, spec.k) == ("fixed", "close", 5)
    spec = parse_morph("adaptive-v2", (20, 85))
    assert (spec.kind, spec.variant, spec.op, spec.quantiles) == (
        "adaptive", "v2", "both", (20.0, 85.0)
    )  # fmt: skip
    assert parse_morph("adaptive-v1-q25-80").quantiles == (25.0, 80.0)
    assert parse_morph("adaptive-v1").scope == "batch"
    spec = parse_morph("adaptive-v3-q30-70-s")
    assert (spec.variant, spec.quantiles, spec.scope) == ("v3", (30.0, 70.0), "sample")
    assert spec.label == "adaptive-v3"
    with pytest.raises(ValueError):
        parse_morph("open-k3-s")  # the per-image suffix is for adaptive policies only
    with pytest.raises(ValueError, match="erode-k3"):
        parse_morph("erode-k3")


def _layered_logits(rows: list[int], width: int = 10) -> torch.Tensor:
    """(1, 9, H, W) logits whose argmax stacks classes 0..8 with `rows` rows each."""
    labels = np.concatenate([np.full(r, c) for c, r in enumerate(rows)])
    onehot = np.eye(9)[labels]  # H, 9
    return torch.from_numpy(np.repeat(onehot.T[:, :, None], width, axis=2)[None]).float()


def test_thickness_counts_pixels_per_column():
    logits = _layered_logits([3, 1, 2, 4, 0, 5, 6, 7, 2])
    t = thickness(logits)
    np.testing.assert_allclose(t[0].numpy(), [3, 1, 2, 4, 0, 5, 6, 7, 2])


@pytest.mark.parametrize("variant,thick_op", [(1, "open"), (2, "both"), (3, "close")])
def test_adaptive_policy_assigns_documented_operations(variant, thick_op):
    # retinal classes 1..7 with thicknesses 1, 4, 5, 6, 7, 8, 20: q20 = 4.6, q85 = 11.6
    # (linear interpolation) → class 1, 2 thin; 3..6 intermediate; 7 thick.
    rows = [2, 1, 4, 5, 6, 7, 8, 20, 3]
    assert parse_morph(f"adaptive-v{variant}").op == thick_op  # the registry's operation
    a = assign(thickness(_layered_logits(rows)), thick_op, (20, 85), "batch")
    assert float(a.t_thin[0]) == pytest.approx(np.percentile([1, 4, 5, 6, 7, 8, 20], 20))
    assert float(a.t_thick[0]) == pytest.approx(np.percentile([1, 4, 5, 6, 7, 8, 20], 85))
    names = [OPERATIONS[c] if c >= 0 else None for c in a.codes[0].tolist()]
    assert names == [None, "close", "close", "both", "both", "both", "both", thick_op, None]


def test_batch_scope_uses_batch_means_and_sample_scope_each_image():
    thin = _layered_logits([2, 1, 4, 5, 6, 7, 8, 20, 3])
    other = _layered_logits([2, 20, 4, 5, 6, 7, 8, 1, 3])  # classes 1 and 7 swapped
    logits = torch.cat([thin, other])
    t = thickness(logits)
    batch = assign(t, "open", (20, 85), "batch")
    assert torch.equal(batch.codes[0], batch.codes[1])  # one policy for the whole batch
    sample = assign(t, "open", (20, 85), "sample")
    assert OPERATIONS[int(sample.codes[0, 1])] == "close"
    assert OPERATIONS[int(sample.codes[1, 1])] == "open"
    assert OPERATIONS[int(sample.codes[1, 7])] == "close"


def test_adaptive_apply_transforms_each_class_with_its_operation():
    torch.manual_seed(0)
    logits = torch.randn(2, 9, 12, 12)
    spec = parse_morph("adaptive-v2")
    out, a = apply_morph(spec, logits)
    for b in range(2):
        for c in range(9):
            code = int(a.codes[b, c])
            expected = (
                logits[b, c]
                if code < 0
                else {"open": opening, "close": closing, "both": both}[OPERATIONS[code]](
                    logits[b : b + 1, c : c + 1], 3
                )[0, 0]
            )
            torch.testing.assert_close(out[b, c], expected)
