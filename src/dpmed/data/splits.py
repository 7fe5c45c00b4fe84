"""Subject-level train/val/test splits with an explicit seed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpmed.errors import ConfigError


def split_counts(n: int, fractions: Sequence[float], key: str = "split") -> list[int]:
    """Split `n` items by `fractions` (summing to 1): every split after the first gets
    max(1, round(f·n)) items (0 if f = 0), the first gets the rest, so no item is lost to
    rounding and a small group (e.g. a FeTS institution with 2 subjects) keeps one of each."""
    if len(fractions) == 0 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ConfigError(key, f"fractions {list(fractions)} must be non-negative and sum to 1")
    tail = [max(1, int(round(f * n))) if f > 0 else 0 for f in fractions[1:]]
    head = n - sum(tail)
    counts = [head, *tail]
    if head < 1 or any(c < 1 for c, f in zip(counts, fractions, strict=True) if f > 0):
        raise ConfigError(
            key, f"{n} subjects cannot be split as {list(fractions)}: a split is empty"
        )
    return counts


def split_subjects(
    subjects: Sequence[str],
    fractions: Sequence[float],
    seed: int,
    names: Sequence[str] = ("train", "val", "test"),
    key: str = "split",
) -> dict[str, list[str]]:
    """Assign each subject to one split: a seeded permutation of the sorted subject ids is cut
    into consecutive chunks of `split_counts` sizes. Returns split name → sorted subject ids."""
    if len(names) != len(fractions):
        raise ConfigError(key, f"expected {len(names)} fractions ({', '.join(names)})")
    ordered = sorted(subjects)
    order = np.random.default_rng(seed).permutation(len(ordered))
    counts = split_counts(len(ordered), fractions, key)
    out: dict[str, list[str]] = {}
    start = 0
    for name, count in zip(names, counts, strict=True):
        out[name] = sorted(ordered[i] for i in order[start : start + count])
        start += count
    return out
