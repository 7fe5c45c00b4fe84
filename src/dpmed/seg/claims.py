"""Paper 002's claims as paired comparisons over seeds (`dpmed.report.claims`), read from the
seg runs: test Dice and HD95 from metrics.json, the attack's AUC from attack.json, the mean
gradient cosine from diagnostics/alignment.csv, and (measured, not byte-identical) training
seconds per epoch from metrics.json.

Cells compare runs that differ only in the claimed factor (common random numbers: the same
initial weights and batches), paired by seed. Only the paper's main-grid cells enter (a plain
clip rule, no sweep suffix; a morphology without the ablation suffixes), except for Fig. 2's
learning rate × C sweep. A Dice comparison whose two arms both stay below `LEARNED_DICE` is
below the scale any of these claims is about. Each claim is decided where the paper makes it
(`Claim.primary`: the dataset, model and morphology its sentence or table names); its other
cells are context. "Morphology" is the paper's best-performing fixed variant (§4.3), here the
one of best mean validation Dice in the cell (never picked on the test set). A relative size
("reduced by ∼17 %") is a claim on the ratio of the paired runs (arm / baseline, against 1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.report.claims import RUNS_SEPARATOR, Claim, below, observations, paired
from dpmed.seg.grid import clip_overrides, clip_rule, is_paper_cell
from dpmed.seg.morphology import morph_kind

LEARNED_DICE = 0.1  # below it in both arms, a model has not learned the task
# A Dice gap paper 002 calls no difference: the smallest effect of its orderings of rules.
SAME_DICE = 0.01
_SAME_BASIS = (
    "paper 002 §5.1 and Table 3 call Auto-S 0.7088 and flat 0.7187 (Duke UNet++, DP) the same "
    "('Dice ∼0.71'): a gap below 0.01 Dice is no difference"
)
# Auto-S ≈ flat: above the gap the paper calls the same (0.0099, above), below the smallest gap
# it ranks in that cell (NSGD 0.6840 vs flat 0.7187: 0.035).
EQUIVALENT_DICE = 0.03
PSAC_UMN_RATIO = (0.55, 0.05)  # §5.1 UMN: PSAC ∼40–50 % below: ratio 0.50–0.60
PSAC_MORPH_RATIO = (1.175, 0.075)  # §5.1 UMN: morphology lifts PSAC by ∼10–25 %: 1.10–1.25
# the scale of a Dice pair (`dpmed.report.claims.paired`)
UNLEARNED_REASON = f"neither arm learned (test Dice < {LEARNED_DICE}): below the claim's scale"
UNLEARNED = below("dice", LEARNED_DICE, UNLEARNED_REASON)
CLOSINGS = ("close", "both")  # fixed DP-Morph variants that close (paper 002 §2.4)
RULES = ("flat", "autos", "nsgd", "psac")  # the private clip rules

_MAIN = ("seg_main_{dataset}", "seg_fig[345]_{dataset}")  # Table 3 and Figs. 3-5 per dataset
_TIME = ("seg_fig8_training_time",)
_ALIGN = ("seg_fig7_alignment",)
_ATTACK = ("seg_attack", "seg_fig9_attack")
_NEEDS_RULES = "{arm} and {base} runs of one dataset, model, morphology and ε"
_NEEDS_MORPH = "{runs} runs with a fixed morphology and with none, same dataset, model, rule"
_NO_SIZE = "the paper gives no size (figure only): any significant difference counts"
_RULE_CELL = "dataset {0}, model {1}, morph none, *"  # a rule comparison's deciding cells


_FIG7 = "*, morph none, *"  # Fig. 7: every dataset and model (the paper at ε = 200)
CLAIMS: tuple[Claim, ...] = (
    # --- clipping rules under DP (§5.1) ---
    Claim(
        "seg-autos-equals-flat", "paper 002 §5.1 (Duke)",
        "On Duke, Auto-S and flat clipping keep the same test Dice under DP (both 'Dice ∼0.71', "
        "UNet++ without morphology)",
        "test Dice", "Auto-S", "flat", "equivalent",
        _NEEDS_RULES.format(arm="Auto-S", base="flat"), _MAIN, margin=EQUIVALENT_DICE,
        basis="Table 3 (Duke UNet++, DP, no morph): Auto-S 0.7088 vs flat 0.7187, called the same; "
        "NSGD 0.6840 (0.035 below flat) called weakest: the margin lies between. With three "
        "seeds TOST shows it only if the paired differences' SD is below margin·√3/t(0.95, 2) "
        "≈ 0.018 (at zero mean); the paper's per-arm SDs (Auto-S 0.0317) suggest more seeds",
        combine="primary", primary=_RULE_CELL.format("duke", "unetpp"),
    ),
    Claim(
        "seg-nsgd-below-flat", "paper 002 §5.1 (Duke), §6",
        "On Duke, NSGD keeps less test Dice than flat clipping under DP ('weakest results', in "
        "every model without morphology; on UMN the paper calls NSGD competitive: context only)",
        "test Dice", "NSGD", "flat", "less", _NEEDS_RULES.format(arm="NSGD", base="flat"),
        _MAIN, smallest_effect=SAME_DICE,
        basis=f"{_SAME_BASIS}; Table 3's NSGD gaps (no morph): 0.016–0.245",
        combine="primary", primary=_RULE_CELL.format("duke", "*"),
    ),
    Claim(
        "seg-psac-worst-umn", "paper 002 §5.1 (UMN)",
        "On UMN, PSAC keeps the least test Dice of the rules under DP ('consistently performs "
        "worst for both architectures'): below flat, Auto-S and NSGD",
        "test Dice", "PSAC", "flat / Auto-S / NSGD (`vs`)", "less",
        _NEEDS_RULES.format(arm="PSAC", base="flat, Auto-S or NSGD"), _MAIN,
        smallest_effect=SAME_DICE, basis=_SAME_BASIS,
        combine="primary", primary=_RULE_CELL.format("umn", "*"),
    ),
    Claim(
        "seg-psac-degradation-umn", "paper 002 §5.1 (UMN)",
        "On UMN, PSAC's test Dice is ∼40–50 % below flat clipping's under DP",
        "test Dice ratio PSAC / flat", "PSAC / flat", f"{PSAC_UMN_RATIO[0]:g}", "equivalent",
        _NEEDS_RULES.format(arm="PSAC", base="flat"), _MAIN, margin=PSAC_UMN_RATIO[1],
        basis="§5.1: 'a severe degradation of ∼40–50 % compared to other strategies': the "
        "ratio within 0.50–0.60 (flat the compared strategy)",
        combine="primary", primary=_RULE_CELL.format("umn", "*"),
    ),
    # --- architectures (§5.1) ---
    Claim(
        "seg-unetpp-above-unet-dp", "paper 002 §5.1 (Duke)",
        "On Duke, UNet++ is more robust to DP noise than UNet: higher test Dice 'across most "
        "clipping strategies' (here: averaged over the DP rules, without morphology)",
        "test Dice, mean over the DP rules", "UNet++", "UNet", "greater",
        "UNet++ and UNet DP runs of the same rules, Duke, morphology and ε", _MAIN,
        smallest_effect=SAME_DICE,
        basis=f"{_SAME_BASIS}; Table 3 (DP, no morph) rule means: UNet++ 0.696, UNet 0.628",
        combine="primary", primary="dataset duke, morph none, *",
    ),
    Claim(
        "seg-unetpp-above-infnet-dp", "paper 002 §5.1 (COVID-19)",
        "On COVID-19, UNet++ keeps more test Dice than Inf-Net under DP (∼0.50 vs ∼0.45)",
        "test Dice, mean over the DP rules", "UNet++", "Inf-Net", "greater",
        "UNet++ and Inf-Net DP runs of the same rules, COVID-19, morphology and ε", _MAIN,
        smallest_effect=0.05, basis="§5.1: 'Dice ∼0.50 vs. ∼0.45': a gap of 0.05",
        combine="primary", primary="dataset covidct, morph none, *",
    ),
    Claim(
        "seg-infnet-larger-dp-drop", "paper 002 §5.1 (COVID-19)",
        "On COVID-19, Inf-Net loses more test Dice to DP than UNet++ (∼0.22 vs ∼0.11)",
        "non-private − DP test Dice (mean over the DP rules)", "Inf-Net", "UNet++", "greater",
        "non-private and DP runs of Inf-Net and UNet++ on COVID-19, same morphology", _MAIN,
        smallest_effect=0.11, basis="§5.1: drops '∼0.22 vs. ∼0.11': a gap of 0.11",
        combine="primary", primary="dataset covidct, morph none, *",
    ),
    Claim(
        "seg-infnet-best-nonprivate", "paper 002 §5.1 (COVID-19)",
        "On COVID-19, Inf-Net keeps more non-private test Dice than UNet++ ('the strongest "
        "non-private performance')",
        "test Dice", "Inf-Net", "UNet++", "greater",
        "non-private Inf-Net and UNet++ runs on COVID-19, same morphology", _MAIN,
        smallest_effect=SAME_DICE, basis=_SAME_BASIS,
        combine="primary", primary="dataset covidct, clip none, morph none, *",
    ),
    # --- DP-Morph (§5.1) ---
    Claim(
        "seg-morph-raises-nonprivate-dice-duke", "paper 002 §5.1 (Duke)",
        "On Duke, morphology raises UNet's and UNet++'s non-private test Dice (∼0.6 % and ∼0.5 %)",
        "test Dice", "best fixed morphology", "no morphology", "greater",
        _NEEDS_MORPH.format(runs="non-private Duke"), ("seg_main_{dataset}",),
        smallest_effect=0.003,
        basis="Table 3 (non-private): UNet 0.8158 → 0.8218, UNet++ 0.8145 → 0.8177; the "
        "smaller gain, 0.003 Dice",
        combine="primary", primary="dataset duke, model unet*, clip none, *",
    ),
    Claim(
        "seg-morph-lowers-nonprivate-hd95-duke", "paper 002 §5.1 (Duke)",
        "On Duke, morphology lowers UNet's and UNet++'s non-private HD95 by ∼17 % and ∼19 %",
        "test HD95 ratio morphology / none", "best fixed morphology", "no morphology (1)",
        "less", _NEEDS_MORPH.format(runs="non-private Duke"), ("seg_main_{dataset}",),
        smallest_effect=0.17, basis="§5.1: 'HD95 reduced by roughly 17 % for UNet and 19 % "
        "for UNet++': the smaller, 17 %",
        combine="primary", primary="dataset duke, model unet*, clip none, *",
    ),
    Claim(
        "seg-morph-raises-nonprivate-dice-umn", "paper 002 §5.1 (UMN)",
        "On UMN, morphology raises UNet++'s non-private test Dice by over 6 %",
        "test Dice ratio morphology / none", "best fixed morphology", "no morphology (1)",
        "greater", _NEEDS_MORPH.format(runs="non-private UMN"), ("seg_main_{dataset}",),
        smallest_effect=0.06, basis="§5.1: 'a relative improvement of over 6 %'",
        combine="primary", primary="dataset umn, model unetpp, clip none, *",
    ),
    Claim(
        "seg-morph-raises-nonprivate-dice-covid", "paper 002 §5.1 (COVID-19)",
        "On COVID-19, morphology raises non-private test Dice (∼1–2 %)",
        "test Dice", "best fixed morphology", "no morphology", "greater",
        _NEEDS_MORPH.format(runs="non-private COVID-19"), ("seg_main_{dataset}",),
        smallest_effect=0.01, basis="§5.1: 'Dice gains of ∼1–2 %': the lower end, 0.01",
        combine="primary", primary="dataset covidct, * clip none, *",
    ),
    Claim(
        "seg-morph-raises-dp-dice-umn", "paper 002 §5.1 (UMN)",
        "On UMN, morphology raises test Dice under DP for every clipping rule ('consistently "
        "improves Dice across all clipping strategies')",
        "test Dice", "best fixed morphology", "no morphology", "greater",
        _NEEDS_MORPH.format(runs="DP UMN"), _MAIN, smallest_effect=SAME_DICE, basis=_SAME_BASIS,
        combine="primary", primary="dataset umn, *",
    ),
    Claim(
        "seg-morph-psac-gain-umn", "paper 002 §5.1 (UMN)",
        "On UMN, morphology lifts PSAC's test Dice under DP by ∼10–25 %",
        "test Dice ratio morphology / none (PSAC)", "best fixed morphology",
        f"{PSAC_MORPH_RATIO[0]:g}", "equivalent", _NEEDS_MORPH.format(runs="DP PSAC UMN"), _MAIN,
        margin=PSAC_MORPH_RATIO[1], basis="§5.1: 'improving Dice by ∼10–25 %': the ratio "
        "within 1.10–1.25",
        combine="primary", primary="dataset umn, *",
    ),
    Claim(
        "seg-morph-rescues-nsgd-dice-duke", "paper 002 §5.1 (Duke)",
        "On Duke, morphology lifts NSGD's UNet test Dice under DP by ∼30 %",
        "test Dice ratio morphology / none", "best fixed morphology", "no morphology (1)",
        "greater", _NEEDS_MORPH.format(runs="DP NSGD Duke UNet"), _MAIN, smallest_effect=0.30,
        basis="§5.1: 'improving Dice by ∼30 %' (Table 3: UNet NSGD 0.4727 → 0.6140)",
        combine="primary", primary="dataset duke, model unet, clip nsgd, *",
    ),
    Claim(
        "seg-morph-rescues-nsgd-hd95-duke", "paper 002 §5.1 (Duke)",
        "On Duke, morphology lowers NSGD's UNet HD95 under DP by ∼17 %",
        "test HD95 ratio morphology / none", "best fixed morphology", "no morphology (1)",
        "less", _NEEDS_MORPH.format(runs="DP NSGD Duke UNet"), _MAIN, smallest_effect=0.17,
        basis="§5.1: 'reducing HD95 by ∼17 %' (Table 3: UNet NSGD 13.998 → 11.550)",
        combine="primary", primary="dataset duke, model unet, clip nsgd, *",
    ),
    Claim(
        "seg-closing-raises-dp-dice", "ours (paper 002 §2.4 motivates closing)",
        "A fixed DP-Morph that closes (closing, or opening then closing) raises test Dice "
        "under DP over no morphology",
        "test Dice", "fixed close-k / both-k", "no morphology", "greater",
        "DP runs with a close-k or both-k morphology and with none, same rule and ε", _MAIN,
        basis="our comparison: §2.4 says closing fills gaps, the paper reports no closing-only "
        "result; any significant gain counts; decided on Duke UNet under flat clipping",
        group="beyond", combine="primary", primary="dataset duke, model unet, clip flat, *",
    ),
    # --- adaptive DP-Morph (§5.6, §6) ---
    Claim(
        "seg-adaptive-above-best-fixed", "paper 002 §5.6, §6, Fig. 11",
        "On Duke, the best adaptive policy (v1–v3, by validation Dice) raises UNet++'s test "
        "Dice over the best fixed morphology, non-private and under flat and Auto-S",
        "test Dice", "best adaptive vN", "best fixed variant (validation Dice)", "greater",
        "adaptive and fixed morphology runs of one dataset, model, rule and ε",
        ("seg_main_{dataset}", "seg_fig11_adaptive"), smallest_effect=0.004,
        basis="Table 3: the best policy's smallest gain over the fixed morphology, UNet "
        "non-private v1 0.8266 vs 0.8218 (0.0048); 'up to 1–2 %' bounds it above",
        # Fig. 11's settings: clip none, flat, autos (NSGD and PSAC not claimed, §5.6)
        combine="primary", primary="dataset duke, model unetpp, clip [afn][lou]*",
    ),
    # --- gradient alignment (§5.2): NSGD > flat > Auto-S > PSAC ---
    Claim(
        "seg-alignment-nsgd-highest", "paper 002 §5.2",
        "NSGD preserves the gradient direction best: its clipped batch gradient is closer to "
        "the true one than flat's, Auto-S's and PSAC's",
        "mean cosine over DP steps", "NSGD", "flat / Auto-S / PSAC (`vs`)", "greater",
        _NEEDS_RULES.format(arm="NSGD", base="other rule"), _ALIGN, basis=_NO_SIZE,
        combine="primary", primary=_FIG7,
    ),
    Claim(
        "seg-alignment-autos-below-flat", "paper 002 §5.2",
        "Auto-S aligns worse than flat clipping ('flat follows closely, while Auto-S shows a "
        "broader spread')",
        "mean cosine over DP steps", "Auto-S", "flat", "less",
        _NEEDS_RULES.format(arm="Auto-S", base="flat"), _ALIGN, basis=_NO_SIZE,
        combine="primary", primary=_FIG7,
    ),
    Claim(
        "seg-alignment-psac-lowest", "paper 002 §5.2",
        "PSAC distorts the gradient direction most: its clipped batch gradient is further from "
        "the true one than flat's, Auto-S's and NSGD's (against prior work's claim)",
        "mean cosine over DP steps", "PSAC", "flat / Auto-S / NSGD (`vs`)", "less",
        _NEEDS_RULES.format(arm="PSAC", base="other rule"), _ALIGN, basis=_NO_SIZE,
        combine="primary", primary=_FIG7,
    ),
    # --- global-loss membership attack (§5.4) ---
    Claim(
        "seg-dp-lowers-attack-auc", "paper 002 §5.4 (Duke)",
        "On Duke, DP-SGD lowers the global-loss attack's AUC from ∼0.7–0.8 (non-private) to "
        "below 0.5",
        "attack AUC", "DP run (clip rule, ε)", "non-private", "less",
        "attacked DP and non-private runs of one dataset, model and morphology", _ATTACK,
        smallest_effect=0.2, basis="§5.4: 'from ∼0.7–0.8 to < 0.5': at least 0.2",
        combine="primary", primary="dataset duke, * morph none, *",
    ),
    Claim(
        "seg-attack-below-chance-duke", "paper 002 §5.4 (Duke)",
        "On Duke, the attack's AUC on DP models is below chance (< 0.5)",
        "attack AUC", "DP run (clip rule, ε)", "chance (0.5)", "less",
        "attacked DP runs on Duke", _ATTACK, basis="§5.4: '< 0.5', no size",
        combine="primary", primary="dataset duke, * morph none, *",
    ),
    Claim(
        "seg-attack-above-chance-umn", "paper 002 §5.4 (UMN)",
        "On UMN, the attack's AUC on DP models stays above chance (> 0.5): partial mitigation",
        "attack AUC", "DP run (clip rule, ε)", "chance (0.5)", "greater",
        "attacked DP runs on UMN", _ATTACK, basis="§5.4: '> 0.5', no size",
        combine="primary", primary="dataset umn, * morph none, *",
    ),
    Claim(
        "seg-attack-flat-autos-below-nsgd-psac-duke", "paper 002 §5.4 (Duke)",
        "On Duke, flat and Auto-S protect better than NSGD and PSAC (lower attack AUC)",
        "attack AUC", "flat / Auto-S", "NSGD / PSAC (`vs`)", "less",
        "attacked DP runs of the four rules on Duke", _ATTACK,
        basis="§5.4: 'slightly outperforming', no size",
        combine="primary", primary="dataset duke, * morph none, *",
    ),
    Claim(
        "seg-attack-nsgd-lowest-umn", "paper 002 §5.4 (UMN)",
        "On UMN, NSGD protects best: lower attack AUC than flat, Auto-S and PSAC",
        "attack AUC", "NSGD", "flat / Auto-S / PSAC (`vs`)", "less",
        "attacked DP runs of the four rules on UMN", _ATTACK, basis="§5.4: no size",
        combine="primary", primary="dataset umn, * morph none, *",
    ),
    Claim(
        "seg-attack-psac-highest-umn", "paper 002 §5.4 (UMN)",
        "On UMN, PSAC protects worst: higher attack AUC than flat, Auto-S and NSGD",
        "attack AUC", "PSAC", "flat / Auto-S / NSGD (`vs`)", "greater",
        "attacked DP runs of the four rules on UMN", _ATTACK, basis="§5.4: no size",
        combine="primary", primary="dataset umn, * morph none, *",
    ),
    Claim(
        "seg-attack-autos-below-psac", "paper 002 §5.4",
        "Auto-S generally protects better than PSAC (lower attack AUC, every dataset)",
        "attack AUC", "Auto-S", "PSAC", "less", "attacked Auto-S and PSAC runs", _ATTACK,
        basis="§5.4: Duke and UMN no size; COVID-19 Inf-Net ≈0.50 vs ≈0.62, UNet++ ≈0.42 vs "
        "≈0.52: any significant gap counts",
        combine="primary", primary="*, morph none, *",
    ),
    # --- flat clipping ablation (§4.3, Fig. 2) ---
    Claim(
        "seg-lr-over-clip-norm", "paper 002 §4.3, Fig. 2",
        "Under flat clipping the learning rate moves test Dice more than the clipping "
        "threshold C (Duke and UMN, UNet)",
        "test Dice range over lr − over C", "range over lr (mean over C)",
        "range over C (mean over lr)", "greater",
        "a flat-clipping lr × C sweep (≥ 2 values each) per dataset", ("seg_fig2_lr_clip",),
        smallest_effect=SAME_DICE, basis=f"{_SAME_BASIS}; Fig. 2 gives heatmaps, no size",
    ),
    # --- training time (§5.3), measured ---
    Claim(
        "seg-nsgd-fastest", "paper 002 §5.3",
        "NSGD trains faster per epoch than flat, Auto-S and PSAC ('consistently the most "
        "time-efficient')",
        "training seconds per epoch", "NSGD", "flat / Auto-S / PSAC (`vs`)", "less",
        _NEEDS_RULES.format(arm="NSGD", base="other rule"), _TIME, measured=True,
        basis="§5.3, Fig. 8: no size", combine="primary", primary="*, morph none, *",
    ),
    Claim(
        "seg-autos-psac-slower", "paper 002 §5.3",
        "Auto-S and PSAC cost more training time per epoch (§5.3 names no baseline: here flat "
        "clipping)",
        "training seconds per epoch", "Auto-S / PSAC", "flat", "greater",
        "Auto-S or PSAC and flat runs of one dataset, model, morphology and ε", _TIME,
        measured=True, basis="§5.3, Fig. 8: no size", combine="primary",
        primary="*, morph none, *",
    ),
)  # fmt: skip


_WILDCARDS = ["dataset", "model", "clip", "morph", "eps", "seed"]
_SCORES = ("dice", "val_dice", "hd95")
_RUN_COLUMNS = [*_WILDCARDS, "run", *_SCORES, "seconds_per_epoch"]


def _runs(metrics_paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per metrics.json: wildcards, run folder, test Dice and HD95, val Dice (NaN where
    null), seconds per epoch."""
    rows = []
    for path in metrics_paths:
        metrics = json.loads(Path(path).read_text())
        scores = {k: np.nan if metrics.get(k) is None else float(metrics[k]) for k in _SCORES}
        seconds = metrics["train_seconds"] / metrics["epochs"]
        run = {"run": str(Path(path).parent), "seconds_per_epoch": seconds}
        rows.append(metrics["wildcards"] | scores | run)
    return pd.DataFrame(rows, columns=_RUN_COLUMNS)


def _attacks(paths: Iterable[str | Path]) -> pd.DataFrame:
    rows = [
        (result := json.loads(Path(p).read_text()))["wildcards"]
        | {"auc": float(result["auc"]), "run": str(Path(p).parent)}
        for p in paths
    ]
    return pd.DataFrame([r for r in rows if is_paper_cell(r)], columns=[*_WILDCARDS, "run", "auc"])


def _alignments(paths: Iterable[str | Path]) -> pd.DataFrame:
    rows = []
    for path in paths:
        cosine = pd.read_csv(path)["cosine"].astype(float)
        wc = wildcards_from_path("seg", path)
        if cosine.notna().any() and is_paper_cell(wc):
            rows.append(wc | {"cosine": float(cosine.mean()), "run": str(Path(path).parents[1])})
    return pd.DataFrame(rows, columns=[*_WILDCARDS, "run", "cosine"])


def _rule_pairs(
    runs: pd.DataFrame,
    claim: str,
    metric: str,
    arms: Sequence[str],
    bases: Sequence[str],
    scaled: bool = False,
) -> list[dict]:
    """Each rule of `arms` against each other rule of `bases` in one dataset, model, morph and
    ε; the cell names the baseline (`vs flat`) where several are compared."""
    cell = ["dataset", "model", "morph", "eps"]
    scale = UNLEARNED if scaled else None
    return [
        row
        for arm in arms for base in bases if base != arm
        for row in paired(runs, claim, metric, {"clip": arm}, {"clip": base}, cell, scale,
                          tag=f"vs {base}" if len(bases) > 1 else "")
    ]  # fmt: skip


def _against_rivals(
    runs: pd.DataFrame, claim: str, metric: str, arm: str, rivals: Sequence[str], highest: bool
) -> list[dict]:
    """Rule `arm` against, per dataset, model, morph, ε and seed, the best (`highest`) or the
    worst of `rivals` where every rival ran: "arm highest" as one test per cell, not one per
    rival (a smaller Holm family; the extreme of the rivals makes the test conservative)."""
    key = ["dataset", "model", "morph", "eps", "seed"]
    mine = runs[runs["clip"].isin(rivals) & runs[metric].notna()]
    full = mine.groupby(key)["clip"].transform("nunique") == len(rivals)
    pick = "max" if highest else "min"
    extreme = (
        mine[full]
        .groupby(key, as_index=False)
        .agg(**{metric: (metric, pick), "run": ("run", RUNS_SEPARATOR.join)})
    )
    frame = pd.concat([runs[runs["clip"] == arm], extreme.assign(clip="rivals")])
    tag = f"vs the {'best' if highest else 'worst'} of {'/'.join(rivals)}"
    return paired(frame, claim, metric, {"clip": arm}, {"clip": "rivals"}, key[:-1], tag=tag)


def _ratios(rows: Sequence[dict], centre: float = 1.0) -> list[dict]:
    """`rows` as the ratio arm / baseline of each pair, compared with `centre`."""
    return [
        row | {"arm": row["arm"] / row["baseline"] if row["baseline"] else math.nan,
               "baseline": centre}
        for row in rows
    ]  # fmt: skip


def _best(runs: pd.DataFrame) -> str | None:
    """The morph of `runs` with the best mean validation Dice (None without one)."""
    val = runs.groupby("morph")["val_dice"].mean().dropna()
    return str(val.idxmax()) if not val.empty else None


def _best_pairs(
    runs: pd.DataFrame, claim: str, metric: str, arm_kind: str = "fixed", base_kind: str = "none"
) -> list[dict]:
    """In each dataset, model, rule and ε: the `arm_kind` morph of best validation Dice against
    the `base_kind` one (morph kinds: none, fixed, adaptive), paired by seed; a pair whose
    Dice stays unlearned is dropped whatever `metric`."""
    out = []
    cell = ["dataset", "model", "clip", "eps"]
    for _, group in runs.groupby(cell):
        kinds = group["morph"].map(morph_kind)
        arm, base = _best(group[kinds == arm_kind]), _best(group[kinds == base_kind])
        if arm and base:
            out += paired(group, claim, metric, {"morph": arm}, {"morph": base}, cell, UNLEARNED)
    return out


def _morph_pairs(runs: pd.DataFrame, claim: str, kinds: Sequence[str]) -> list[dict]:
    """Each fixed variant whose name starts with one of `kinds` against no morphology."""
    variants = sorted(
        m for m in set(runs["morph"]) if morph_kind(m) == "fixed" and m.startswith(tuple(kinds))
    )
    cell = ["dataset", "model", "clip", "eps"]
    base = {"morph": "none"}
    return [
        r
        for m in variants
        for r in paired(runs, claim, "dice", {"morph": m}, base, cell, UNLEARNED)
    ]


def _rule_means(runs: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, model, morph, ε and seed of the DP runs: the mean test Dice over its rules
    (`rules` names them, so only runs of the same rules pair) and the non-private run's Dice
    (`np_dice`) and its drop under DP (`drop`)."""
    private = runs[runs["clip"].isin(RULES)]
    if private.empty:
        return pd.DataFrame(columns=[*_WILDCARDS, "rules", "dice", "np_dice", "drop", "run"])
    key = ["dataset", "model", "morph", "seed"]
    means = private.groupby([*key, "eps"], as_index=False).agg(
        dice=("dice", "mean"), rules=("clip", lambda c: "+".join(sorted(c))),
        run=("run", RUNS_SEPARATOR.join),
    )  # fmt: skip
    public = runs[runs["clip"] == "none"][[*key, "dice", "run"]]
    means = means.merge(public.rename(columns={"dice": "np_dice", "run": "np_run"}), on=key,
                        how="left")  # fmt: skip
    with_np = means["run"] + RUNS_SEPARATOR + means["np_run"].fillna("")
    return means.assign(
        drop=means["np_dice"] - means["dice"], run=with_np.str.rstrip(RUNS_SEPARATOR)
    )


def _model_pairs(means: pd.DataFrame, claim: str, metric: str, arm: str, base: str) -> list:
    cell = ["dataset", "morph", "eps", "rules"]
    scale = below("np_dice" if metric == "drop" else "dice", LEARNED_DICE, UNLEARNED_REASON)
    return paired(means, claim, metric, {"model": arm}, {"model": base}, cell, scale)


def _lr_effects(runs: pd.DataFrame) -> list[dict]:
    """Fig. 2: per dataset, model, rule, ε and seed of the lr × C sweep runs, the range of test
    Dice over lr (mean over C) against its range over C (mean over lr)."""
    swept = runs[np.array([bool(clip_overrides(c)) for c in runs["clip"]], dtype=bool)]
    if swept.empty:
        return []
    overrides = [clip_overrides(c) for c in swept["clip"]]
    swept = swept.assign(
        rule=[clip_rule(c) for c in swept["clip"]],
        lr=[o["lr"] for o in overrides],
        C=[o["clip_norm"] for o in overrides],
    )
    rows = []
    for (dataset, model, rule, eps, seed), group in swept.groupby(
        ["dataset", "model", "rule", "eps", "seed"]
    ):
        grid = group.pivot_table(index="lr", columns="C", values="dice", aggfunc="mean")
        if min(grid.shape) < 2:
            continue
        learned = np.nanmax(grid.to_numpy(float)) >= LEARNED_DICE
        rows.append(dict(
            claim="seg-lr-over-clip-norm", seed=int(seed),
            cell=f"dataset {dataset}, model {model}, clip {rule}, eps {eps}",
            arm=float((grid.max() - grid.min()).mean()),  # over lr, per C
            baseline=float((grid.max(axis=1) - grid.min(axis=1)).mean()),  # over C, per lr
            scale="" if learned else UNLEARNED_REASON,
        ))  # fmt: skip
    return rows


def _chance(attacks: pd.DataFrame, claim: str) -> list[dict]:
    """Each DP run's attack AUC against chance (0.5)."""
    return [
        dict(claim=claim, seed=int(r.seed), arm=r.auc, baseline=0.5, arm_run=r.run,
             cell=f"dataset {r.dataset}, model {r.model}, morph {r.morph}, clip {r.clip}, "
                  f"eps {r.eps}")
        for r in attacks[attacks["eps"] != "inf"].itertuples(index=False)
    ]  # fmt: skip


def _dice_observations(runs: pd.DataFrame) -> list[dict]:
    """The claims on test Dice and HD95 of the main grid (§5.1, §5.6)."""
    rows = _rule_pairs(runs, "seg-autos-equals-flat", "dice", ["autos"], ["flat"], True)
    rows += _rule_pairs(runs, "seg-nsgd-below-flat", "dice", ["nsgd"], ["flat"], True)
    rows += _rule_pairs(runs, "seg-psac-worst-umn", "dice", ["psac"], RULES, True)
    psac = _rule_pairs(runs, "seg-psac-degradation-umn", "dice", ["psac"], ["flat"], True)
    rows += _ratios(psac, PSAC_UMN_RATIO[0])
    means = _rule_means(runs)
    rows += _model_pairs(means, "seg-unetpp-above-unet-dp", "dice", "unetpp", "unet")
    rows += _model_pairs(means, "seg-unetpp-above-infnet-dp", "dice", "unetpp", "infnet")
    rows += _model_pairs(means, "seg-infnet-larger-dp-drop", "drop", "infnet", "unetpp")
    public, private = runs[runs["eps"] == "inf"], runs[runs["eps"] != "inf"]
    rows += paired(public, "seg-infnet-best-nonprivate", "dice", {"model": "infnet"},
                   {"model": "unetpp"}, ["dataset", "clip", "morph", "eps"], UNLEARNED)  # fmt: skip
    for where in ("duke", "covid"):
        rows += _best_pairs(public, f"seg-morph-raises-nonprivate-dice-{where}", "dice")
    rows += _ratios(_best_pairs(public, "seg-morph-lowers-nonprivate-hd95-duke", "hd95"))
    rows += _ratios(_best_pairs(public, "seg-morph-raises-nonprivate-dice-umn", "dice"))
    rows += _best_pairs(private, "seg-morph-raises-dp-dice-umn", "dice")
    psac = private[private["clip"] == "psac"]
    rows += _ratios(_best_pairs(psac, "seg-morph-psac-gain-umn", "dice"), PSAC_MORPH_RATIO[0])
    nsgd = private[private["clip"] == "nsgd"]
    rows += _ratios(_best_pairs(nsgd, "seg-morph-rescues-nsgd-dice-duke", "dice"))
    rows += _ratios(_best_pairs(nsgd, "seg-morph-rescues-nsgd-hd95-duke", "hd95"))
    rows += _morph_pairs(private, "seg-closing-raises-dp-dice", CLOSINGS)
    rows += _best_pairs(runs, "seg-adaptive-above-best-fixed", "dice", "adaptive", "fixed")
    return rows


def _attack_observations(attacks: pd.DataFrame) -> list[dict]:
    """The claims on the global-loss attack's AUC (§5.4)."""
    rows = []
    for (clip, eps), _ in attacks[attacks["eps"] != "inf"].groupby(["clip", "eps"]):
        rows += paired(
            attacks, "seg-dp-lowers-attack-auc", "auc", {"clip": clip, "eps": eps},
            {"clip": "none", "eps": "inf"}, ["dataset", "model", "morph"],
        )  # fmt: skip
    rows += _chance(attacks, "seg-attack-below-chance-duke")
    rows += _chance(attacks, "seg-attack-above-chance-umn")
    claim = "seg-attack-flat-autos-below-nsgd-psac-duke"
    rows += _rule_pairs(attacks, claim, "auc", ["flat", "autos"], ["nsgd", "psac"])
    rows += _rule_pairs(attacks, "seg-attack-nsgd-lowest-umn", "auc", ["nsgd"], RULES)
    rows += _rule_pairs(attacks, "seg-attack-psac-highest-umn", "auc", ["psac"], RULES)
    rows += _rule_pairs(attacks, "seg-attack-autos-below-psac", "auc", ["autos"], ["psac"])
    return rows


def study_observations(
    metrics_paths: Sequence[str], attack_paths: Sequence[str], alignment_paths: Sequence[str]
) -> tuple[tuple[Claim, ...], pd.DataFrame]:
    """The registered claims and their observations from the seg runs' files."""
    every = _runs(metrics_paths)
    runs = every[np.array([is_paper_cell(wc) for wc in every.to_dict("records")], dtype=bool)]
    rows = _dice_observations(runs) + _lr_effects(every)
    align = _alignments(alignment_paths)
    others = [rule for rule in RULES if rule != "nsgd"]
    rows += _against_rivals(align, "seg-alignment-nsgd-highest", "cosine", "nsgd", others, True)
    rows += _rule_pairs(align, "seg-alignment-autos-below-flat", "cosine", ["autos"], ["flat"])
    others = [rule for rule in RULES if rule != "psac"]
    rows += _against_rivals(align, "seg-alignment-psac-lowest", "cosine", "psac", others, False)
    rows += _attack_observations(_attacks(attack_paths))
    rows += _rule_pairs(runs, "seg-nsgd-fastest", "seconds_per_epoch", ["nsgd"], RULES)
    for rule in ("autos", "psac"):
        rows += _rule_pairs(runs, "seg-autos-psac-slower", "seconds_per_epoch", [rule], ["flat"])
    return CLAIMS, observations(rows)
