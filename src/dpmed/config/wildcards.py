"""Allowed values of every wildcard and how numbers are spelled in paths.

`WILDCARD_PATTERNS` feeds Snakemake's `wildcard_constraints` so no rule can match a path it was
not written for (e.g. `eps` never swallows a slash, `dataset` only names known datasets).
"""

from __future__ import annotations

import math
import re

from dpmed.data.registry import DATASETS

SEG_DATASETS = ("duke", "umn", "covidct")
SEG_MODELS = ("unet", "unetpp", "lfunet", "infnet")
SEG_CLIPS = ("none", "flat", "nsgd", "autos", "psac")
SEG_MORPH_PATTERN = r"none|(?:open|close|both)-k[35]|adaptive-v[123](?:-q[0-9]+-[0-9]+)?(?:-s)?"

FETS_AGGREGATORS = ("fedavg", "simagg", "dp_simagg", "dp_fedavg")
FETS_DPMODES = ("none", "paper", "sound")

XCAL_DATASETS = ("bloodmnist", "pneumoniamnist", "dermamnist")
XCAL_MODELS = ("resnet18", "efficientnet_b0")
XCAL_METHODS = ("nondp", "centralized", "static", "agp", "xcal")
XCAL_SHIFTS = ("iid", "label", "covariate")

NUMBER_PATTERN = r"[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?"
EPS_PATTERN = rf"inf|{NUMBER_PATTERN}"
# A seg clip wildcard may carry a hyperparameter sweep (paper 002 Fig. 2): `flat-C0.5-lr0.001`.
SWEEP_KEYS = {"clip_norm": "C", "lr": "lr"}
SEG_CLIP_PATTERN = rf"(?:{'|'.join(SEG_CLIPS)})(?:-C{NUMBER_PATTERN}-lr{NUMBER_PATTERN})?"
_CLIP_SWEEP = re.compile(rf"^([a-z]+)-C({NUMBER_PATTERN})-lr({NUMBER_PATTERN})$")


def _alternatives(values: tuple[str, ...]) -> str:
    return "|".join(values)


WILDCARD_PATTERNS: dict[str, str] = {
    "dataset": _alternatives(DATASETS),
    "model": _alternatives(SEG_MODELS + XCAL_MODELS),
    "clip": SEG_CLIP_PATTERN,
    "morph": SEG_MORPH_PATTERN,
    "aggregator": _alternatives(FETS_AGGREGATORS),
    "dpmode": _alternatives(FETS_DPMODES),
    "method": r"(?:nondp|centralized|static|agp|xcal)(?:-[a-z0-9]+)?",
    "shift": _alternatives(XCAL_SHIFTS),
    "clients": r"[1-9][0-9]*",
    "eps": EPS_PATTERN,
    "seed": r"[0-9]+",
}


def clip_rule(clip: str) -> str:
    """The clipping rule of a seg clip wildcard (`flat-C0.5-lr0.001` → `flat`)."""
    match = _CLIP_SWEEP.match(clip)
    return match.group(1) if match else clip


def clip_overrides(clip: str) -> dict[str, float]:
    """Hyperparameters a swept clip wildcard sets (`flat-C0.5-lr0.001` → clip_norm, lr)."""
    match = _CLIP_SWEEP.match(clip)
    if not match:
        return {}
    return {"clip_norm": float(match.group(2)), "lr": float(match.group(3))}


def sweep_clip(rule: str, clip_norm: float, lr: float) -> str:
    """The clip wildcard of one sweep cell (inverse of `clip_rule` + `clip_overrides`).

    >>> sweep_clip("flat", 0.5, 1e-3), clip_overrides(sweep_clip("flat", 2, 3e-05))
    ('flat-C0.5-lr0.001', {'clip_norm': 2.0, 'lr': 3e-05})
    """
    return f"{rule}-C{format_eps(clip_norm)}-lr{format_eps(lr)}"


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
