"""Stable seeds derived from names (wildcards), never from Python's salted `hash()`."""

from __future__ import annotations

import hashlib


def stable_seed(*parts: object, bits: int = 32) -> int:
    """Return a deterministic non-negative integer seed from `parts` (sha256 of their reprs).

    The same parts give the same seed on every machine and Python process, so a job's
    randomness depends only on its wildcards and config.
    """
    text = "\x1f".join(str(p) for p in parts)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % (1 << bits)
