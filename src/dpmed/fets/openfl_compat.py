"""OpenFL 1.9 on NumPy >= 2.4: its lossless pipeline decompresses every tensor with
`np.reshape(..., newshape=...)`, a keyword NumPy 2.4 removed, so an aggregator or collaborator
fails on the first tensor it receives. `patch_numpy_reshape` swaps in the same reshape without
that keyword (same bytes, same float32 array); on older NumPy it changes nothing."""

from __future__ import annotations

import numpy as np
from openfl.pipelines.pipeline import Float32NumpyArrayToBytes


def _needs_patch() -> bool:
    try:
        np.reshape(np.zeros(1), newshape=(1,))
    except TypeError:
        return True
    return False


def _backward(self: Float32NumpyArrayToBytes, data: bytes, metadata: dict, **kwargs) -> np.ndarray:
    """OpenFL's `Float32NumpyArrayToBytes.backward` without the removed keyword."""
    flat = np.frombuffer(data, dtype=np.float32)
    return np.reshape(flat, tuple(metadata["int_list"]), order="C")


def patch_numpy_reshape() -> bool:
    """Patch OpenFL's float32 decompression when this NumPy needs it; True when patched."""
    if not _needs_patch():
        return False
    Float32NumpyArrayToBytes.backward = _backward
    return True
