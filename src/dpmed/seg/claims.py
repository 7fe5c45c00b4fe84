"""Paper 002's claims as paired comparisons over seeds (`dpmed.report.claims`), read from the
seg runs: test Dice from metrics.json, the attack's AUC from attack.json, the mean gradient
cosine from diagnostics/alignment.csv, and (measured, not byte-identical) training seconds per
epoch from metrics.json.

Cells compare runs that differ only in the claimed factor (common random numbers: the same
initial weights and batches), paired by seed. Only the paper's main-grid cells enter (a plain
clip rule, no sweep suffix; a morphology without the ablation suffixes). A Dice comparison whose
two arms both stay below `LEARNED_DICE` is below the scale any of these claims is about.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.report.claims import Claim, below, observations, paired
from dpmed.seg.grid import is_paper_cell
from dpmed.seg.morphology import is_plain, morph_kind

LEARNED_DICE = 0.1  # below it in both arms, a model has not learned the task
EQUIVALENT_DICE = 0.02  # the margin of "Auto-S ≈ flat": a fiftieth of the Dice scale
# the scale of a Dice pair (`dpmed.report.claims.paired`)
UNLEARNED = below(
    "dice",
    LEARNED_DICE,
    f"neither arm learned (test Dice < {LEARNED_DICE}): below the claim's scale",
)
CLOSINGS = ("close", "both")  # fixed DP-Morph variants that close (paper 002 §2.4)

_MAIN = ("seg_main_{dataset}", "seg_fig[345]_{dataset}")  # Table 3 and Figs. 3-5 per dataset
_TIME = ("seg_fig8_training_time",)
_NEEDS_RULES = "{arm} and flat runs of one dataset, model, morphology and ε"
CLAIMS: tuple[Claim, ...] = (
    Claim(
        "seg-autos-equals-flat", "paper 002 §5.1, §6",
        "Auto-S and flat clipping keep the same test Dice under DP (both the best rules)",
        "test Dice", "Auto-S", "flat", "equivalent", _NEEDS_RULES.format(arm="Auto-S"),
        _MAIN, margin=EQUIVALENT_DICE,
    ),
    Claim(
        "seg-nsgd-below-flat", "paper 002 §5.1, §6",
        "NSGD keeps less test Dice than flat clipping under DP (weakest on Duke)",
        "test Dice", "NSGD", "flat", "less", _NEEDS_RULES.format(arm="NSGD"),
        _MAIN,
    ),
    Claim(
        "seg-psac-below-flat", "paper 002 §5.1, §6",
        "PSAC keeps less test Dice than flat clipping under DP (worst on UMN)",
        "test Dice", "PSAC", "flat", "less", _NEEDS_RULES.format(arm="PSAC"),
        _MAIN,
    ),
    Claim(
        "seg-closing-raises-dp-dice", "paper 002 §5.1",
        "A fixed DP-Morph that closes (closing, or opening then closing) raises test Dice "
        "under DP over no morphology",
        "test Dice", "fixed close-k / both-k", "no morphology", "greater",
        "DP runs with a close-k or both-k morphology and with none, same rule and ε",
        _MAIN,
    ),
    Claim(
        "seg-fixed-morph-raises-nonprivate-dice", "paper 002 §5.1",
        "Fixed DP-Morph raises non-private test Dice over no morphology",
        "test Dice", "fixed morphology", "no morphology", "greater",
        "non-private runs with a fixed morphology and with none", ("seg_main_{dataset}",),
    ),
    Claim(
        "seg-adaptive-above-best-fixed", "paper 002 §5.6, §6",
        "Adaptive DP-Morph (v1-v3) raises test Dice over the best fixed morphology",
        "test Dice", "adaptive vN", "best fixed variant (validation Dice)", "greater",
        "adaptive and fixed morphology runs of one dataset, model, rule and ε",
        ("seg_main_{dataset}", "seg_fig11_adaptive"),
    ),
    Claim(
        "seg-alignment-nsgd-above-flat", "paper 002 §5.2",
        "NSGD preserves the gradient direction best: its clipped batch gradient is closer to "
        "the true one than flat clipping's",
        "mean cosine over DP steps", "NSGD", "flat", "greater",
        _NEEDS_RULES.format(arm="NSGD"), ("seg_fig7_alignment",),
    ),
    Claim(
        "seg-alignment-psac-below-flat", "paper 002 §5.2",
        "PSAC distorts the gradient direction most: its clipped batch gradient is further "
        "from the true one than flat clipping's",
        "mean cosine over DP steps", "PSAC", "flat", "less",
        _NEEDS_RULES.format(arm="PSAC"), ("seg_fig7_alignment",),
    ),
    Claim(
        "seg-dp-lowers-attack-auc", "paper 002 §5.4",
        "DP-SGD lowers the global-loss membership attack's AUC below the non-private model's",
        "attack AUC", "DP run (clip rule, ε)", "non-private", "less",
        "attacked DP and non-private runs of one dataset, model and morphology",
        ("seg_attack", "seg_fig9_attack"),
    ),
    Claim(
        "seg-nsgd-fastest", "paper 002 §5.3",
        "NSGD trains faster per epoch than flat clipping",
        "training seconds per epoch", "NSGD", "flat", "less",
        _NEEDS_RULES.format(arm="NSGD"), _TIME, measured=True,
    ),
    Claim(
        "seg-autos-psac-slower", "paper 002 §5.3",
        "Auto-S and PSAC cost more training time per epoch (§5.3 names no baseline: here flat "
        "clipping)",
        "training seconds per epoch", "Auto-S / PSAC", "flat", "greater",
        "Auto-S or PSAC and flat runs of one dataset, model, morphology and ε", _TIME,
        measured=True,
    ),
)  # fmt: skip


_WILDCARDS = ["dataset", "model", "clip", "morph", "eps", "seed"]


def _runs(metrics_paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per metrics.json of a main-grid cell: wildcards, test and val Dice, seconds per
    epoch."""
    rows = []
    for path in metrics_paths:
        metrics = json.loads(Path(path).read_text())
        wc = metrics["wildcards"]
        if not is_paper_cell(wc):
            continue
        rows.append(
            wc | {
                "dice": _number(metrics.get("dice")),
                "val_dice": _number(metrics.get("val_dice")),
                "seconds_per_epoch": metrics["train_seconds"] / metrics["epochs"],
            }
        )  # fmt: skip
    return pd.DataFrame(rows, columns=[*_WILDCARDS, "dice", "val_dice", "seconds_per_epoch"])


def _number(value: float | None) -> float:
    return np.nan if value is None else float(value)


def _attacks(paths: Iterable[str | Path]) -> pd.DataFrame:
    rows = [
        (result := json.loads(Path(p).read_text()))["wildcards"] | {"auc": float(result["auc"])}
        for p in paths
    ]
    return pd.DataFrame([r for r in rows if is_paper_cell(r)], columns=[*_WILDCARDS, "auc"])


def _alignments(paths: Iterable[str | Path]) -> pd.DataFrame:
    rows = []
    for path in paths:
        cosine = pd.read_csv(path)["cosine"].astype(float)
        wc = wildcards_from_path("seg", path)
        if cosine.notna().any() and is_paper_cell(wc):
            rows.append(wc | {"cosine": float(cosine.mean())})
    return pd.DataFrame(rows, columns=[*_WILDCARDS, "cosine"])


def _rules(runs: pd.DataFrame, claim: str, metric: str, rule: str, scaled: bool) -> list[dict]:
    cell = ["dataset", "model", "morph", "eps"]
    scale = UNLEARNED if scaled else None
    return paired(runs, claim, metric, {"clip": rule}, {"clip": "flat"}, cell, scale)


def _morph_pairs(runs: pd.DataFrame, claim: str, private: bool, kinds: Sequence[str]) -> list:
    """Each fixed variant whose name starts with one of `kinds` against no morphology."""
    dp = runs[(runs["eps"] != "inf") == private]
    variants = sorted(
        m for m in set(dp["morph"]) if morph_kind(m) == "fixed" and m.startswith(tuple(kinds))
    )
    cell = ["dataset", "model", "clip", "eps"]
    base = {"morph": "none"}
    return [
        r for m in variants for r in paired(dp, claim, "dice", {"morph": m}, base, cell, UNLEARNED)
    ]


def _best_fixed(runs: pd.DataFrame) -> list[dict]:
    """Each paper adaptive variant against the fixed variant of best mean validation Dice in
    the same dataset, model, rule and ε, paired by seed."""
    out = []
    cell = ["dataset", "model", "clip", "eps"]
    kinds = runs["morph"].map(morph_kind)
    for _, group in runs.groupby(cell):
        fixed = group[kinds[group.index] == "fixed"]
        if fixed.empty:
            continue
        best = fixed.groupby("morph")["val_dice"].mean().idxmax()
        adaptive = sorted(m for m in set(group["morph"]) if morph_kind(m) == "adaptive")
        for morph in adaptive:
            out += paired(
                group, "seg-adaptive-above-best-fixed", "dice", {"morph": morph},
                {"morph": best}, cell, UNLEARNED,
            )  # fmt: skip
    return out


def seg_observations(
    metrics_paths: Sequence[str], attack_paths: Sequence[str], alignment_paths: Sequence[str]
) -> tuple[tuple[Claim, ...], pd.DataFrame]:
    """The registered claims and their observations from the seg runs' files."""
    runs = _runs(metrics_paths)
    plain = runs[runs["morph"].map(is_plain)] if not runs.empty else runs
    rows = []
    for rule, claim in (("autos", "seg-autos-equals-flat"), ("nsgd", "seg-nsgd-below-flat"),
                        ("psac", "seg-psac-below-flat")):  # fmt: skip
        rows += _rules(plain, claim, "dice", rule, scaled=True)
    rows += _morph_pairs(plain, "seg-closing-raises-dp-dice", True, CLOSINGS)
    rows += _morph_pairs(plain, "seg-fixed-morph-raises-nonprivate-dice", False, ("",))
    rows += _best_fixed(plain)
    alignment = _alignments(alignment_paths)
    rows += _rules(alignment, "seg-alignment-nsgd-above-flat", "cosine", "nsgd", scaled=False)
    rows += _rules(alignment, "seg-alignment-psac-below-flat", "cosine", "psac", scaled=False)
    attacks = _attacks(attack_paths)
    private = attacks[attacks["eps"] != "inf"]
    for (clip, eps), _ in private.groupby(["clip", "eps"]):
        rows += paired(
            attacks, "seg-dp-lowers-attack-auc", "auc", {"clip": clip, "eps": eps},
            {"clip": "none", "eps": "inf"}, ["dataset", "model", "morph"],
        )  # fmt: skip
    rows += _rules(plain, "seg-nsgd-fastest", "seconds_per_epoch", "nsgd", scaled=False)
    for rule in ("autos", "psac"):
        rows += _rules(plain, "seg-autos-psac-slower", "seconds_per_epoch", rule, scaled=False)
    return CLAIMS, observations(rows)
