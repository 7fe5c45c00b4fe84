"""FedAvg's weighted average of model tensors, shared by the studies' servers.

Works on NumPy arrays and torch tensors alike and computes in the tensors' own dtype: each
weight is cast to that dtype before the product, the products are accumulated in place in
argument order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def weighted_sum(values: Sequence[T], alpha: Sequence[float]) -> T:
    """Σ α_i v_i in the values' dtype (one pass over each value, one scratch buffer)."""
    first = values[0]
    if isinstance(first, np.ndarray | np.generic | float | int):
        first = np.asarray(first)
    out = first * _cast(first, alpha[0])
    scratch = _empty_like(out)
    for a, value in zip(alpha[1:], values[1:], strict=True):
        _multiply(value, _cast(first, a), scratch)
        out += scratch
    return out


def weighted_average(values: Sequence[T], weights: Sequence[float]) -> T:
    """Σ W_i v_i / Σ W_i (FedAvg: W_i is client i's sample count or data-size weight)."""
    w = np.asarray(weights, dtype=np.float64)
    return weighted_sum(values, w / w.sum())


def _cast(like: Any, value: float) -> Any:
    if isinstance(like, np.ndarray):
        return like.dtype.type(value)
    return float(value)


def _empty_like(like: Any) -> Any:
    if isinstance(like, np.ndarray | np.generic):
        return np.empty_like(like)
    import torch

    return torch.empty_like(like)


def _multiply(value: Any, scalar: Any, out: Any) -> None:
    if isinstance(out, np.ndarray):
        np.multiply(value, scalar, out=out)
    else:
        import torch

        torch.mul(value, scalar, out=out)
