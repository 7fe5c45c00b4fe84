"""How numbers are spelled in run-folder paths (a leaf module: the study specs use it, so it
imports no study; `dpmed.config.grid.wildcard_patterns` gathers every study's patterns)."""

from __future__ import annotations

import math

NUMBER_PATTERN = r"[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?"
EPS_PATTERN = rf"inf|{NUMBER_PATTERN}"


def format_eps(eps: float | int | str) -> str:
    """Spell ε for a path: integers without a decimal point, `inf` for non-private, else repr.

    >>> [format_eps(x) for x in (200, 0.5, 1e-3, float("inf"), "inf")]
    ['200', '0.5', '0.001', 'inf', 'inf']
    """
    value = float(eps)
    if math.isinf(value):
        return "inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def parse_eps(text: str) -> float:
    """Inverse of `format_eps` (`inf` → math.inf)."""
    return math.inf if text == "inf" else float(text)
