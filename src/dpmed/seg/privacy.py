"""The privacy of a seg run: what its privacy.json record (`dpmed.seg.run.privacy_record`)
covers, and the paper's recipe recomputed for it.

Our recipe: DP-SGD facts with ε from both RDP and PRV for the same (σ, q, steps), or guarantee
"none" for non-private runs; adaptive DP-Morph with batch-level thresholds is labelled
"paper-approximation" (it couples the images of a batch). The guarantee covers the model
weights after every DP-SGD step (`COVERS`); `not_covered` names what the run writes beside them
outside the mechanism, the diagnostics/ files first. The noise is seeded by the job seed (Opacus
secure_mode off): reproducible, not for deployment (`extra.noise_source`).

The paper's recipe, for the same run: a shuffled fixed-size loader accounted as Poisson, a
batch-summed Dice loss, batch-level adaptive thresholds, the public implementations' noise per
clip rule (`ClipEntry.paper_noise`) and Inf-Net's several optimizer steps per sampled batch
counted as one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpmed.privacy import accounting
from dpmed.privacy.clipping import CLIP_RULES, ClipRule
from dpmed.seg.morphology import morph_kind
from dpmed.seg.outputs import ALIGNMENT, ATTACK_FILE, HISTORY, MORPH_LOG

COVERS = (
    "the model weights after every DP-SGD step (model.pt holds the last) and anything computed "
    "from them without the training images, e.g. the validation and test scores and epsilon"
)
NOT_COVERED = (
    f"{ALIGNMENT}: per DP step the exact Poisson batch size, the share of clipped gradients and "
    "the cosine of the un-noised clipped gradient sum, computed from the training batches "
    "outside the mechanism",
    f"{HISTORY}: the loss column is the mean training loss per epoch, computed on the training "
    "images without noise (the seconds column is a wall-clock timing)",
    f"{MORPH_LOG}: adaptive DP-Morph's layer thickness, thresholds and operation shares per "
    "epoch, computed from the training batches without noise",
    f"{ATTACK_FILE} (written later by seg_attack): the membership attack's scores, threshold "
    "and mean losses, computed on the training images directly",
    "privacy.json extra.empty_batches: how many Poisson batches came out empty, a statistic of "
    "the sampling that the mechanism does not release",
    "metrics.json n_train, privacy.json sample_rate: the training set size, treated as public "
    "as DP-SGD accounting does",
    "metrics.json train_seconds: wall-clock training time, a side channel the guarantee does "
    "not model",
    "metrics.json scores: they describe the validation and test splits, which the guarantee "
    "does not protect (it protects training images only)",
    "the job log (logs/seg_train/...): its progress lines print each epoch's training loss",
)


# Inf-Net's public training loop (MyTrain_LungInf.py) rescales each sampled batch to the
# size_rates (0.75, 1, 1.25) and calls optimizer.step() once per scale: k = 3 DP steps per
# batch. Counting k·steps treats them as separately sampled (what Opacus' accountant reports
# when hooked to every optimizer.step); they reuse one batch, so the exact cost is higher still
# (σ/√k per batch).
INFNET_STEPS_PER_BATCH = 3
NOT_DP = "not DP"
# Why the paper's recipe is only an approximation (the clip rules add their own `paper_flaw`).
PAPER_REASONS = {
    "loader": "the paper's code trains on a shuffled fixed-size loader while the accountant "
    "assumes Poisson subsampling (docs/privacy.md, finding 6)",
    "dice": "its Dice loss is summed over the batch, coupling the images: one image changes "
    "every per-sample gradient, so the per-sample sensitivity C does not hold "
    "(docs/privacy.md, finding 6)",
    "adaptive": "adaptive DP-Morph thresholds over the batch couple the images (paper 002 §3.2; "
    "docs/privacy.md, finding 11)",
    "infnet": f"Inf-Net took {INFNET_STEPS_PER_BATCH} DP steps per batch but counted one: ε "
    f"recomputed with {INFNET_STEPS_PER_BATCH}× the steps, a lower bound "
    "(docs/privacy.md, finding 6)",
}


def paper_recipe(record: Mapping[str, Any], model: str, morph: str) -> dict[str, object]:
    """The paper's recipe recomputed for one private seg run.

    Args:
        record: the run's privacy.json (our recipe's σ, q, steps, δ and clip rule).
        model: the run's model wildcard.
        morph: the run's morph wildcard.

    Returns the paper's noise multiplier (NaN when data-dependent), accounted steps, ε by RDP
    at the run's δ (inf when not DP), guarantee and reasons.
    """
    name = record["extra"]["clip_rule"]
    entry = CLIP_RULES[name]
    sigma, steps = record["noise_multipliers"][0], int(record["steps"])
    reasons = [PAPER_REASONS["loader"], PAPER_REASONS["dice"]]
    if morph_kind(morph) == "adaptive":
        reasons.append(PAPER_REASONS["adaptive"])
    if model == "infnet":
        steps *= INFNET_STEPS_PER_BATCH
        reasons.append(PAPER_REASONS["infnet"])
    if entry.paper_flaw:
        reasons.insert(0, entry.paper_flaw)
    if entry.paper_noise is None:
        multiplier, eps = math.nan, math.inf
    else:
        rule = ClipRule(
            name, record["clip_norm"], record["extra"]["autos_gamma"], record["extra"]["r"]
        )
        multiplier = entry.paper_noise(sigma, rule)
        history = [(multiplier, record["sample_rate"], steps)]
        eps = accounting.epsilon(history, record["delta"], "rdp")
    return {
        "paper_noise_multiplier": multiplier,
        "paper_steps": steps,
        "paper_eps_rdp": eps,
        "paper_guarantee": NOT_DP if entry.paper_noise is None else "paper-approximation",
        "paper_reasons": "; ".join(reasons),
    }
