"""Federated partitions of a training set over clients (XCal-FL settings), pure numpy.

Three settings, each deterministic from `seed` (one `np.random.default_rng(seed)` per call):

- IID (`partition_iid`): a seeded permutation of all sample indices cut into `n_clients` chunks
  with `np.array_split` (sizes differ by at most 1); each client's indices are sorted.
- Label shift (`partition_label_shift`): per-class Dirichlet proportions. Draw order: first, for
  each class c = 0..K-1, the shuffled indices of the samples of class c (`rng.permutation`);
  then, per attempt, for each class c = 0..K-1, proportions p_c ~ Dirichlet(α·1_{n_clients})
  (`rng.dirichlet`). Class c's n_c shuffled indices are cut at the boundaries
  floor(cumsum(p_c)·n_c) with the last boundary set to n_c, i.e. client k receives
  counts[c, k] = b_k − b_{k−1} samples of class c (b_{−1} = 0). If any client ends with fewer than
  `min_size` samples, ALL proportions are redrawn (the shuffles are kept), up to `MAX_ATTEMPTS`
  attempts, then ConfigError. Small α → each class concentrated on few clients (heterogeneous);
  large α → near-IID.
- Covariate shift (`partition_covariate_shift`): IID indices, and client k's images are scaled in
  brightness by factor k of `brightness_factors` (linear from `low` to `high`) with
  `apply_brightness` (multiply, round half to even, clip to [0, 255]).

Invalid settings raise ConfigError naming the config key (`KEY_CLIENTS`, `KEY_ALPHA`,
`KEY_MIN_SIZE`, `KEY_BRIGHTNESS`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpmed.errors import ConfigError

# Keys of config/schema.yaml (a block's `params` may override the `defaults`).
KEY_CLIENTS = "xcal.grid[].clients"
KEY_ALPHA = "xcal.defaults.dirichlet_alpha"
KEY_MIN_SIZE = "xcal.grid[].clients (min_size per client)"
KEY_BRIGHTNESS = "xcal.defaults.brightness"
MAX_ATTEMPTS = 1000


@dataclass(frozen=True)
class LabelShiftPartition:
    """Result of `partition_label_shift`.

    `indices[k]`: sorted int64 sample indices of client k; `proportions`: (n_classes, n_clients)
    Dirichlet draw that produced them (row c sums to 1); `attempts`: draws needed for min_size.
    """

    indices: list[np.ndarray]
    proportions: np.ndarray
    attempts: int


@dataclass(frozen=True)
class CovariateShiftPartition:
    """Result of `partition_covariate_shift`: IID `indices[k]` and brightness `factors[k]`."""

    indices: list[np.ndarray]
    factors: np.ndarray


def partition_iid(n_samples: int, n_clients: int, seed: int) -> list[np.ndarray]:
    """Split range(n_samples) into n_clients near-equal random parts (sorted int64 indices)."""
    _check_clients(n_clients, n_samples)
    perm = np.random.default_rng(seed).permutation(n_samples)
    return [np.sort(part).astype(np.int64) for part in np.array_split(perm, n_clients)]


def partition_label_shift(
    labels: np.ndarray,
    n_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 1,
    n_classes: int | None = None,
) -> LabelShiftPartition:
    """Label-shift partition of samples with integer `labels` (N,) by per-class Dirichlet(α)
    proportions (rule and draw order in the module docstring). `n_classes` defaults to
    max(label) + 1; classes without samples still get a proportion row."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or labels.min(initial=0) < 0:
        raise ValueError("labels must be a 1-D array of non-negative integers")
    _check_clients(n_clients, labels.size)
    if not (np.isfinite(alpha) and alpha > 0):
        raise ConfigError(KEY_ALPHA, f"Dirichlet alpha must be a positive number, got {alpha}")
    if min_size < 0 or min_size * n_clients > labels.size:
        raise ConfigError(
            KEY_MIN_SIZE,
            f"min_size {min_size} × {n_clients} clients exceeds the {labels.size} samples",
        )
    n_classes = int(labels.max(initial=-1)) + 1 if n_classes is None else n_classes
    if n_classes < int(labels.max(initial=-1)) + 1:
        raise ValueError(f"n_classes {n_classes} is smaller than max(label) + 1")
    rng = np.random.default_rng(seed)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(n_classes)]
    sizes = np.array([idx.size for idx in by_class])
    for attempt in range(1, MAX_ATTEMPTS + 1):
        proportions = np.stack([rng.dirichlet(np.full(n_clients, alpha)) for _ in by_class])
        counts = dirichlet_counts(proportions, sizes)
        if counts.sum(axis=0).min() >= min_size:
            return LabelShiftPartition(_assign(by_class, counts), proportions, attempt)
    raise ConfigError(
        f"{KEY_ALPHA} / {KEY_CLIENTS}",
        f"no Dirichlet(alpha={alpha}) draw in {MAX_ATTEMPTS} attempts gave every one of "
        f"{n_clients} clients at least {min_size} of {labels.size} samples; "
        "raise alpha or use fewer clients",
    )


def dirichlet_counts(proportions: np.ndarray, class_sizes: np.ndarray) -> np.ndarray:
    """Samples per (class, client): row c = diff([0, floor(cumsum(p_c)·n_c)]) with the last
    boundary forced to n_c, so every sample of the class is assigned exactly once."""
    sizes = np.asarray(class_sizes, dtype=np.int64)[:, None]
    bounds = np.floor(np.cumsum(proportions, axis=1) * sizes).astype(np.int64)
    bounds = np.minimum(bounds, sizes)
    bounds[:, -1] = sizes[:, 0]
    return np.diff(bounds, axis=1, prepend=0)


def _assign(by_class: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Cut each class's shuffled indices by `counts` (n_classes, n_clients); sorted per client."""
    parts: list[list[np.ndarray]] = [[] for _ in range(counts.shape[1])]
    for idx, row in zip(by_class, counts, strict=True):
        for k, chunk in enumerate(np.split(idx, np.cumsum(row)[:-1])):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def brightness_factors(n_clients: int, low: float = 0.6, high: float = 1.4) -> np.ndarray:
    """Per-client brightness factors linear from `low` to `high` (np.linspace); one client gets
    the mean (low + high) / 2."""
    if n_clients < 1:
        raise ConfigError(KEY_CLIENTS, f"need at least 1 client, got {n_clients}")
    if not (0 <= low <= high):
        raise ConfigError(KEY_BRIGHTNESS, f"need 0 <= low <= high, got [{low}, {high}]")
    if n_clients == 1:
        return np.array([(low + high) / 2.0])
    return np.linspace(low, high, n_clients)


def apply_brightness(images: np.ndarray, factor: float) -> np.ndarray:
    """Scale uint8 images by `factor`: multiply in float64, round half to even, clip to
    [0, 255], back to uint8 (same shape)."""
    if images.dtype != np.uint8:
        raise TypeError(f"apply_brightness expects uint8 images, got {images.dtype}")
    return np.clip(np.rint(images.astype(np.float64) * factor), 0, 255).astype(np.uint8)


def partition_covariate_shift(
    n_samples: int, n_clients: int, seed: int, low: float = 0.6, high: float = 1.4
) -> CovariateShiftPartition:
    """Covariate shift: `partition_iid` indices plus `brightness_factors(n_clients, low, high)`."""
    factors = brightness_factors(n_clients, low, high)
    return CovariateShiftPartition(partition_iid(n_samples, n_clients, seed), factors)


def _check_clients(n_clients: int, n_samples: int) -> None:
    """1 ≤ n_clients ≤ n_samples, else ConfigError on KEY_CLIENTS."""
    if n_clients < 1:
        raise ConfigError(KEY_CLIENTS, f"need at least 1 client, got {n_clients}")
    if n_clients > n_samples:
        raise ConfigError(KEY_CLIENTS, f"{n_clients} clients but only {n_samples} samples")
