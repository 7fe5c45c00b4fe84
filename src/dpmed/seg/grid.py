"""The seg study's grid (paper 002): its datasets, models and wildcard patterns (from the data,
model, clip rule and morphology registries), which cells are jobs, the clip wildcard's sweep
suffix, the block switches and the config rules a schema cannot express. A light module: the
rule file imports it at parse time."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpmed.config.study import SweepResult, Wildcards, block_params, param_key, param_sets
from dpmed.config.wildcards import EPS_PATTERN, NUMBER_PATTERN, format_eps
from dpmed.data.registry import study_datasets
from dpmed.errors import ConfigError
from dpmed.models import MODELS, models_of_kind
from dpmed.privacy.clipping import CLIP_RULES
from dpmed.seg.morphology import is_plain, morph_kind, morph_pattern, parse_morph, unsupported

# The datasets registered for seg, in the order of every per-dataset table and figure.
SEG_DATASETS = study_datasets("seg")
# The datasets also scored with the structure measures S_α and E_φ (COVID-19 lung CT).
STRUCTURE_DATASETS = ("covidct",)
SEG_MODELS = models_of_kind("seg2d")

# A clip wildcard may carry a hyperparameter sweep (paper 002 Fig. 2): `flat-C0.5-lr0.001`.
SWEEP_KEYS = {"clip_norm": "C", "lr": "lr"}
_CLIP_SWEEP = re.compile(rf"^([a-z]+)-C({NUMBER_PATTERN})-lr({NUMBER_PATTERN})$")
# Models that need at least three down-sampling stages (Inf-Net: three high-level features).
MIN_DEPTH = {"infnet": 3}
# Block keys that choose a run's outputs, not its training: `attack: false` leaves a block's
# cells unscored by the membership attack.
SWITCHES = {"attack": True}

AXES = (
    ("datasets", "dataset"),
    ("models", "model"),
    ("clips", "clip"),
    ("morphs", "morph"),
    ("eps", "eps"),
    ("seeds", "seed"),
)


PATTERNS = {
    "dataset": "|".join(SEG_DATASETS),
    "model": "|".join(SEG_MODELS),
    # a registered rule, optionally with a sweep suffix
    "clip": rf"(?:{'|'.join(CLIP_RULES.names())})(?:-C{NUMBER_PATTERN}-lr{NUMBER_PATTERN})?",
    "morph": morph_pattern(),
    "eps": EPS_PATTERN,
    "seed": r"[0-9]+",
}
# The config values of the registry-named grid lists (schema enums and patterns at load).
CHOICES: dict[str, tuple[str, ...] | str] = {
    "datasets": SEG_DATASETS,
    "models": SEG_MODELS,
    "clips": CLIP_RULES.names(),
    "morphs": morph_pattern(),
}


def clip_rule(clip: str) -> str:
    """The clipping rule of a clip wildcard (`flat-C0.5-lr0.001` → `flat`)."""
    match = _CLIP_SWEEP.match(clip)
    return match.group(1) if match else clip


def clip_overrides(clip: str) -> dict[str, float]:
    """Hyperparameters a swept clip wildcard sets (`flat-C0.5-lr0.001` → clip_norm, lr)."""
    match = _CLIP_SWEEP.match(clip)
    if not match:
        return {}
    return {"clip_norm": float(match.group(2)), "lr": float(match.group(3))}


def wildcard_params(wildcards: Mapping[str, Any]) -> dict[str, float]:
    """Hyperparameters the wildcards of an off-grid target spell (a swept clip)."""
    return clip_overrides(str(wildcards["clip"]))


def sweep_clip(rule: str, clip_norm: float, lr: float) -> str:
    """The clip wildcard of one sweep cell (inverse of `clip_rule` + `clip_overrides`).

    >>> sweep_clip("flat", 0.5, 1e-3), clip_overrides(sweep_clip("flat", 2, 3e-05))
    ('flat-C0.5-lr0.001', {'clip_norm': 2.0, 'lr': 3e-05})
    """
    return f"{rule}-C{format_eps(clip_norm)}-lr{format_eps(lr)}"


def is_paper_cell(wildcards: Mapping[str, str]) -> bool:
    """A cell of the paper's main grid (Table 3, Figs. 3–5, 8): a plain clip rule and a morph
    without the ablation suffixes (lr × C sweep, quantiles, per-image scope)."""
    return wildcards["clip"] in CLIP_RULES and is_plain(wildcards["morph"])


def is_shown_cell(wildcards: Mapping[str, str]) -> bool:
    """A cell the paper's qualitative figures show (Figs. 6, 9, 10): a main-grid cell without
    adaptive morphology."""
    return is_paper_cell(wildcards) and morph_kind(wildcards["morph"]) != "adaptive"


def invalid(wc: Mapping[str, str]) -> str | None:
    """Why a seg combination is not a job (None when it is one)."""
    private = wc["eps"] != "inf"
    if CLIP_RULES[clip_rule(wc["clip"])].bounded != private:
        return "clip 'none' pairs with eps inf, every other clip with a finite eps"
    return unsupported(wc["morph"], wc["dataset"])


def sweep(wildcards: Wildcards, params: Mapping[str, Any], cfg: Mapping[str, Any]) -> SweepResult:
    """One job per (clip_norm, lr) of a block's sweep, the clip wildcard spelling both."""
    wc = dict(wildcards)
    if not CLIP_RULES[clip_rule(wc["clip"])].bounded:
        return "a sweep (clip_norm × lr) applies to private clip rules only"
    out = []
    for values in itertools.product(*(cfg[k] for k in SWEEP_KEYS)):
        cell = dict(zip(SWEEP_KEYS, values, strict=True))
        clip = sweep_clip(wc["clip"], **cell)
        job_params = {**params, **{k: float(v) for k, v in cell.items()}}
        out.append((tuple((k, clip if k == "clip" else v) for k, v in wildcards), job_params))
    return out


def attacked(jobs: Sequence[Any]) -> list[Any]:
    """The jobs the membership attack scores: those of blocks with `attack: true` (the default;
    `attack: false` leaves, e.g., a demo's too-short coverage runs unscored)."""
    return [job for job in jobs if job.switches.get("attack", True)]


def _check_block(config: Mapping[str, Any], index: int) -> None:
    section = config["seg"]
    block, params = section["grid"][index], block_params(section, index)
    where = f"seg.grid[{index}]"
    for morph in block["morphs"]:
        try:
            parse_morph(morph, tuple(params["quantiles"]))
        except ValueError as err:
            raise ConfigError(f"{where}.morphs", str(err)) from None
    depth, depth_key = int(params["depth"]), param_key("seg", section, index, "depth")
    for model in block["models"]:
        least = MIN_DEPTH.get(model, 1)
        if depth < least:
            raise ConfigError(
                depth_key,
                f"{MODELS[model].label} ({where}.models) needs depth ≥ {least}, got {depth}",
            )
    for dataset in block["datasets"]:
        size = config["data"][dataset]["size"]
        if any(side % 2**depth for side in size):
            raise ConfigError(
                depth_key,
                f"depth {depth} halves the image {depth} times, so the sides of "
                f"data.{dataset}.size {size} ({where}) must divide by 2^{depth} = {2**depth}",
            )
    weights = params.get("backbone_weights")
    if weights is not None and "infnet" in block["models"] and not Path(weights).is_file():
        raise ConfigError(
            param_key("seg", section, index, "backbone_weights"), f"no file '{weights}'"
        )


def check_config(config: Mapping[str, Any], jobs: Sequence[Any]) -> None:
    """Config rules a schema cannot express: quantiles need q_low < q_high; every morph of a
    block parses (a `-qL-H` suffix needs 0 ≤ L ≤ H ≤ 100); each block's depth suits its models
    and the image size of its datasets (sides divisible by 2^depth); Inf-Net's local backbone
    weights exist."""
    for where, params in param_sets(config["seg"]):
        if "quantiles" in params:
            low, high = params["quantiles"]
            if not low < high:
                raise ConfigError(
                    f"seg.{where}.quantiles", f"need q_low < q_high, got {low}, {high}"
                )
    for index in range(len(config["seg"]["grid"])):
        _check_block(config, index)
