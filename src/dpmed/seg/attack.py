"""Global-loss membership inference on one trained seg run (paper 002 §5.4, Fig. 9).

Members are the run's training images, non-members the held-out images (val + test) of the
same dataset; the larger set is subsampled (seeded) to the size of the smaller, so both sides
count n. Each side is split (seeded) into a calibration part of round(f·n) images (Python's
round, half to even; f = `params["attack_calibration"]`) and an evaluation part with the rest.
The score of an image is −loss, its per-sample training loss
(`dpmed.seg.losses.per_sample_loss`: CE + dice_weight · (1 − soft Dice)) on the model's
eval-mode output after the run's DP-Morph; in eval mode the networks return only the final
map, so deep-supervision side maps and Inf-Net's edge term do not enter. τ comes from the
calibration scores, every reported metric from the evaluation scores (`dpmed.metrics.membership`);
attack.json keeps the evaluation scores of every image (`evaluation_scores`: members,
nonmembers) for the report's bootstrap over images.

Adaptive DP-Morph with batch scope makes one image's logits depend on the rest of its batch;
such runs are scored one image at a time (a batch of one, which equals the per-image scope),
so a score never depends on which other images were drawn. The other runs are scored in
batches of `batch_size` (eval mode, GroupNorm: per-image outputs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpmed.config.grid import common_seed
from dpmed.io import write_json
from dpmed.metrics.membership import attack_metrics
from dpmed.models import load_model
from dpmed.runtime import JobContext
from dpmed.seg.data import Split, load_seg_data
from dpmed.seg.evaluate import morph_output
from dpmed.seg.losses import per_sample_loss
from dpmed.seg.morphology import MorphSpec, parse_morph
from dpmed.seg.outputs import ATTACK_FILE
from dpmed.seg.sizing import scoring_batch_size

SCORE = (
    "score = -per_sample_loss (CE + dice_weight*(1 - soft Dice)) of the eval-mode output after "
    "DP-Morph; predicted member iff score >= threshold"
)


def image_losses(
    net: torch.nn.Module,
    spec: MorphSpec,
    split: Split,
    dice_weight: float,
    batch_size: int,
    device: torch.device,
) -> np.ndarray:
    """Per-image loss (float64, [N]) of `net` on `split`, DP-Morph applied as in training."""
    losses = []
    with torch.no_grad():
        for start in range(0, len(split), batch_size):
            x = split.images[start : start + batch_size].to(device)
            y = split.masks[start : start + batch_size].to(device)
            output, _ = morph_output(spec, net(x))
            losses.append(per_sample_loss(output, y, dice_weight).double().cpu().numpy())
    return np.concatenate(losses) if losses else np.zeros(0)


def _subset(split: Split, index: np.ndarray) -> Split:
    idx = torch.from_numpy(index)
    return Split(split.images[idx], split.masks[idx])


def run_attack(job: JobContext) -> dict[str, Any]:
    """Attack the model in the job's run folder, write `attack.json` there and return it.

    Args:
        job: the attacked run: its processed data, folder (`out_dir`), wildcards, params
            (quantiles, batch_size, dice_weight, attack_calibration), seed, device, threads.
    """
    wc, params = dict(job.wildcards), job.params
    device = job.start()
    data = load_seg_data(job.processed_dir, wc["dataset"])
    spec = parse_morph(wc["morph"], tuple(params["quantiles"]))
    net = load_model(Path(job.out_dir) / "model.pt", device)

    members = data.splits["train"]
    val, test = data.splits["val"], data.splits["test"]
    nonmembers = Split(torch.cat([val.images, test.images]), torch.cat([val.masks, test.masks]))
    n = min(len(members), len(nonmembers))
    n_cal = int(round(float(params["attack_calibration"]) * n))
    if n_cal < 1 or n - n_cal < 1:
        raise ValueError(
            f"membership attack needs ≥ 1 calibration and ≥ 1 evaluation image per side: "
            f"{n} per side, calibration fraction {params['attack_calibration']}"
        )
    # the seed block's images, calibration and evaluation split: paired over clip rules and ε
    rng = np.random.default_rng(common_seed("seg", wc, "attack"))
    sides = {}
    for name, split in (("members", members), ("nonmembers", nonmembers)):
        chosen = np.sort(rng.choice(len(split), size=n, replace=False))
        order = rng.permutation(chosen)
        sides[name] = (
            _subset(split, np.sort(order[:n_cal])),
            _subset(split, np.sort(order[n_cal:])),
        )

    batch = scoring_batch_size(spec, params)
    weight = float(params["dice_weight"])
    scores = {
        name: tuple(-image_losses(net, spec, part, weight, batch, device) for part in parts)
        for name, parts in sides.items()
    }
    result: dict[str, Any] = attack_metrics(
        (scores["members"][0], scores["nonmembers"][0]),
        (scores["members"][1], scores["nonmembers"][1]),
    )
    result |= {
        "counts": {
            "n_members_available": len(members),
            "n_nonmembers_available": len(nonmembers),
            "n_members": n,
            "n_nonmembers": n,
            "n_calibration": {"members": n_cal, "nonmembers": n_cal},
            "n_evaluation": {"members": n - n_cal, "nonmembers": n - n_cal},
        },
        "min_nonzero_fpr": 1 / (n - n_cal),
        "mean_loss": {name: float(-np.concatenate(parts).mean()) for name, parts in scores.items()},
        "score": SCORE,
        "evaluation_scores": {  # per image, so the report can bootstrap over images
            name: [float(v) for v in parts[1]] for name, parts in scores.items()
        },
        "scoring_batch_size": batch,
        "metrics_split": "evaluation (threshold from calibration)",
        "wildcards": wc,
        "seed": job.seed,
    }
    write_json(Path(job.out_dir) / ATTACK_FILE, result)
    return result
