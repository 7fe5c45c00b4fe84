"""The seg study's grid and outputs (paper 002): axes, validity, wildcard patterns, the clip
wildcard's sweep suffix, run files, and which runs feed the paper's main tables. A light
module: the rule file imports it at parse time."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dpmed.config.study import StudySpec, SweepResult, Wildcards
from dpmed.config.wildcards import EPS_PATTERN, NUMBER_PATTERN, format_eps

SEG_DATASETS = ("duke", "umn", "covidct")
SEG_MODELS = ("unet", "unetpp", "lfunet", "infnet")
SEG_CLIPS = ("none", "flat", "nsgd", "autos", "psac")
SEG_MORPH_PATTERN = r"none|(?:open|close|both)-k[35]|adaptive-v[123](?:-q[0-9]+-[0-9]+)?(?:-s)?"

# A clip wildcard may carry a hyperparameter sweep (paper 002 Fig. 2): `flat-C0.5-lr0.001`.
SWEEP_KEYS = {"clip_norm": "C", "lr": "lr"}
SEG_CLIP_PATTERN = rf"(?:{'|'.join(SEG_CLIPS)})(?:-C{NUMBER_PATTERN}-lr{NUMBER_PATTERN})?"
_CLIP_SWEEP = re.compile(rf"^([a-z]+)-C({NUMBER_PATTERN})-lr({NUMBER_PATTERN})$")

# Files every seg_train job writes into its folder (checkpoint.pt is not among them: it is
# only there while a job runs or after it was killed).
RUN_FILES = (
    "metrics.json",
    "history.csv",
    "morph_log.csv",
    "alignment.csv",
    "privacy.json",
    "model.pt",
)
# Paper 002 Figs. 3–5: the clipping × morphology figure of each dataset.
FIGURES = {"duke": "seg_fig3_duke", "umn": "seg_fig4_umn", "covidct": "seg_fig5_covidct"}

_PAPER_MORPH = re.compile(r"^(?:none|(?:open|close|both)-k[35]|adaptive-v[123])$")


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


def sweep_clip(rule: str, clip_norm: float, lr: float) -> str:
    """The clip wildcard of one sweep cell (inverse of `clip_rule` + `clip_overrides`).

    >>> sweep_clip("flat", 0.5, 1e-3), clip_overrides(sweep_clip("flat", 2, 3e-05))
    ('flat-C0.5-lr0.001', {'clip_norm': 2.0, 'lr': 3e-05})
    """
    return f"{rule}-C{format_eps(clip_norm)}-lr{format_eps(lr)}"


def is_paper_cell(wildcards: Mapping[str, str]) -> bool:
    """A cell of the paper's main grid (Table 3, Figs. 3–5, 8): a plain clip rule and a morph
    without the ablation suffixes (lr × C sweep, quantiles, per-image scope)."""
    return wildcards["clip"] in SEG_CLIPS and bool(_PAPER_MORPH.match(wildcards["morph"]))


def invalid(wc: Mapping[str, str]) -> str | None:
    """Why a seg combination is not a job (None when it is one)."""
    private = wc["eps"] != "inf"
    if (clip_rule(wc["clip"]) == "none") == private:
        return "clip 'none' pairs with eps inf, every other clip with a finite eps"
    if wc["morph"].startswith("adaptive") and wc["dataset"] != "duke":
        return "adaptive DP-Morph needs the multi-class retinal layers of duke"
    return None


def sweep(wildcards: Wildcards, params: Mapping[str, Any], cfg: Mapping[str, Any]) -> SweepResult:
    """One job per (clip_norm, lr) of a block's sweep, the clip wildcard spelling both."""
    wc = dict(wildcards)
    if clip_rule(wc["clip"]) == "none":
        return "a sweep (clip_norm × lr) applies to private clip rules only"
    out = []
    for values in itertools.product(*(cfg[k] for k in SWEEP_KEYS)):
        cell = dict(zip(SWEEP_KEYS, values, strict=True))
        clip = sweep_clip(wc["clip"], **cell)
        job_params = {**params, **{k: float(v) for k, v in cell.items()}}
        out.append((tuple((k, clip if k == "clip" else v) for k, v in wildcards), job_params))
    return out


def targets(jobs: Sequence[Any]) -> list[str]:
    """Every run file of every job (tables and figures: the rule file adds them for now)."""
    return [f"{job.path}/{name}" for job in jobs for name in RUN_FILES]


SPEC = StudySpec(
    name="seg",
    path="results/seg/{dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}",
    axes=(
        ("datasets", "dataset"),
        ("models", "model"),
        ("clips", "clip"),
        ("morphs", "morph"),
        ("eps", "eps"),
        ("seeds", "seed"),
    ),
    patterns={
        "dataset": "|".join(SEG_DATASETS),
        "model": "|".join(SEG_MODELS),
        "clip": SEG_CLIP_PATTERN,
        "morph": SEG_MORPH_PATTERN,
        "eps": EPS_PATTERN,
        "seed": r"[0-9]+",
    },
    invalid=invalid,
    run_files=RUN_FILES,
    targets=targets,
    category="seg (paper 002)",
    sweep=sweep,
    wildcard_params=lambda wc: clip_overrides(str(wc["clip"])),
)
