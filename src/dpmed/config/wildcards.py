"""How numbers are spelled in run-folder paths, and the wildcard patterns of every rule.

`wildcard_patterns()` feeds Snakemake's global `wildcard_constraints` so no rule can match a
path it was not written for (e.g. `eps` never swallows a slash, `dataset` only names known
datasets); each study's rules add their own spec's narrower patterns.
"""

from __future__ import annotations

import math

NUMBER_PATTERN = r"[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?"
EPS_PATTERN = rf"inf|{NUMBER_PATTERN}"


def wildcard_patterns() -> dict[str, str]:
    """Every wildcard of every study: the alternation of the studies' patterns (a wildcard
    two studies share, e.g. `model`, accepts either's values); `dataset` names every dataset
    of the data registry."""
    from dpmed.data.registry import DATASETS
    from dpmed.studies import STUDIES

    patterns: dict[str, list[str]] = {"dataset": ["|".join(DATASETS)]}
    for _, spec in STUDIES.items():
        for wildcard, pattern in spec.patterns.items():
            if wildcard == "dataset":
                continue
            if pattern not in patterns.setdefault(wildcard, []):
                patterns[wildcard].append(pattern)
    return {wc: "|".join(f"(?:{p})" for p in alts) if len(alts) > 1 else alts[0]
            for wc, alts in patterns.items()}  # fmt: skip


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
