"""Allowed values of every wildcard and how numbers are spelled in paths.

`WILDCARD_PATTERNS` feeds Snakemake's `wildcard_constraints` so no rule can match a path it was
not written for (e.g. `eps` never swallows a slash, `dataset` only names known datasets).
"""

from __future__ import annotations

import math

from dpmed.data.registry import DATASETS

SEG_DATASETS = ("duke", "umn", "covidct")
SEG_MODELS = ("unet", "unetpp", "lfunet", "infnet")
SEG_CLIPS = ("none", "flat", "nsgd", "autos", "psac")
SEG_MORPH_PATTERN = r"none|(?:open|close|both)-k[35]|adaptive-v[123](?:-q[0-9]+-[0-9]+)?"

FETS_AGGREGATORS = ("fedavg", "simagg", "dp_simagg", "dp_fedavg")
FETS_DPMODES = ("none", "paper", "sound")

XCAL_DATASETS = ("bloodmnist", "pneumoniamnist", "dermamnist")
XCAL_MODELS = ("resnet18", "efficientnet_b0")
XCAL_METHODS = ("nondp", "centralized", "static", "agp", "xcal")
XCAL_SHIFTS = ("iid", "label", "covariate")

EPS_PATTERN = r"inf|[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?"


def _alternatives(values: tuple[str, ...]) -> str:
    return "|".join(values)


WILDCARD_PATTERNS: dict[str, str] = {
    "dataset": _alternatives(DATASETS),
    "model": _alternatives(SEG_MODELS + XCAL_MODELS),
    "clip": _alternatives(SEG_CLIPS),
    "morph": SEG_MORPH_PATTERN,
    "aggregator": _alternatives(FETS_AGGREGATORS),
    "dpmode": _alternatives(FETS_DPMODES),
    "method": r"(?:nondp|centralized|static|agp|xcal)(?:-[a-z0-9]+)?",
    "shift": _alternatives(XCAL_SHIFTS),
    "clients": r"[1-9][0-9]*",
    "eps": EPS_PATTERN,
    "seed": r"[0-9]+",
}


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
