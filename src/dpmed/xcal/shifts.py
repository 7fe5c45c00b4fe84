"""The xcal distribution shifts: how a training split is dealt to the clients.

One registered function per shift, `split(images, labels, n_clients, params, seed)` → one
(images, labels) pair per client, deterministic from `seed`. The schema enum, the `shift`
wildcard and the report's shift order read `SHIFTS`, in registration order. Light at import
(the Snakefile reads the names); the partitions themselves are in `dpmed.data.partition`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dpmed.registry import Registry

if TYPE_CHECKING:
    import numpy as np

    Parts = list[tuple[np.ndarray, np.ndarray]]

# The shift of the main tables; centralized runs pool the data, so they have only this one.
POOLED = "iid"

SHIFTS: Registry[Callable[..., Parts]] = Registry("xcal shift")


@SHIFTS.register(POOLED)
def iid(
    images: np.ndarray, labels: np.ndarray, n_clients: int, params: Mapping[str, Any], seed: int
) -> Parts:
    """A seeded permutation cut into `n_clients` near-equal chunks."""
    from dpmed.data.partition import partition_iid

    return [(images[i], labels[i]) for i in partition_iid(labels.size, n_clients, seed)]


@SHIFTS.register("label")
def label(
    images: np.ndarray, labels: np.ndarray, n_clients: int, params: Mapping[str, Any], seed: int
) -> Parts:
    """Per-class Dirichlet(`dirichlet_alpha`) proportions over the clients (≥ 1 sample each)."""
    from dpmed.data.partition import partition_label_shift

    split = partition_label_shift(labels, n_clients, params["dirichlet_alpha"], seed, 1)
    return [(images[i], labels[i]) for i in split.indices]


@SHIFTS.register("covariate")
def covariate(
    images: np.ndarray, labels: np.ndarray, n_clients: int, params: Mapping[str, Any], seed: int
) -> Parts:
    """IID indices; client k's images scaled in brightness by the k-th factor linear in
    `brightness` = [low, high]."""
    from dpmed.data.partition import apply_brightness, partition_covariate_shift

    low, high = params["brightness"]
    cov = partition_covariate_shift(labels.size, n_clients, seed, low, high)
    return [
        (apply_brightness(images[i], f), labels[i])
        for i, f in zip(cov.indices, cov.factors, strict=True)
    ]


def partition(
    images: np.ndarray,
    labels: np.ndarray,
    shift: str,
    n_clients: int,
    params: Mapping[str, Any],
    seed: int,
) -> Parts:
    """(images, labels) per client under the `SHIFTS` name `shift`: images uint8 (N, H, W, C),
    labels int (N,); the shift reads its own keys of the job's `params`, `seed` seeds the
    partition."""
    return SHIFTS[shift](images, labels, n_clients, params, seed)
