"""Subject-level train/val/test splits with an explicit seed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpmed.errors import ConfigError, DataFormatError


def split_counts(n: int, fractions: Sequence[float], key: str = "split") -> list[int]:
    """Split `n` items by `fractions` (summing to 1): every split after the first gets
    max(1, round(f·n)) items (0 if f = 0), the first gets the rest, so no item is lost to
    rounding and a small group (e.g. a FeTS institution with 2 subjects) keeps one of each."""
    counts = _counts(n, fractions, key)
    if _empty(counts, fractions):
        raise ConfigError(
            key, f"{n} subjects cannot be split as {list(fractions)}: a split is empty"
        )
    return counts


def _counts(n: int, fractions: Sequence[float], key: str) -> list[int]:
    """The counts `split_counts` describes, before checking that no split is empty."""
    if len(fractions) == 0 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ConfigError(key, f"fractions {list(fractions)} must be non-negative and sum to 1")
    tail = [max(1, int(round(f * n))) if f > 0 else 0 for f in fractions[1:]]
    return [n - sum(tail), *tail]


def _empty(counts: Sequence[int], fractions: Sequence[float]) -> list[int]:
    """Indices of the splits with a positive fraction but no item (the first split too)."""
    pairs = enumerate(zip(counts, fractions, strict=True))
    return [i for i, (count, fraction) in pairs if count < 1 and (fraction > 0 or i == 0)]


def split_subjects(
    subjects: Sequence[str],
    fractions: Sequence[float],
    seed: int,
    names: Sequence[str] = ("train", "val", "test"),
    key: str = "split",
    source: str | Path | None = None,
    unit: str = "subjects",
) -> dict[str, list[str]]:
    """Assign each subject to one split: a seeded permutation of the sorted subject ids is cut
    into consecutive chunks of `split_counts` sizes. Returns split name → sorted subject ids.

    Too few subjects to give every split one is a `DataFormatError` naming `source` (the raw
    file or folder the subjects come from) and the empty splits, or without `source` a
    `ConfigError` naming `key`. `unit` says what the subjects are in that message.
    """
    if len(names) != len(fractions):
        raise ConfigError(key, f"expected {len(names)} fractions ({', '.join(names)})")
    ordered = sorted(subjects)
    if source is None:
        counts = split_counts(len(ordered), fractions, key)
    else:
        counts = _counts(len(ordered), fractions, key)
        empty = [names[i] for i in _empty(counts, fractions)]
        if empty:
            raise DataFormatError(
                source,
                f"{len(ordered)} {unit} cannot be split as {list(fractions)} ({key}): the "
                f"{' and '.join(empty)} split would be empty",
            )
    order = np.random.default_rng(seed).permutation(len(ordered))
    out: dict[str, list[str]] = {}
    start = 0
    for name, count in zip(names, counts, strict=True):
        out[name] = sorted(ordered[i] for i in order[start : start + count])
        start += count
    return out
