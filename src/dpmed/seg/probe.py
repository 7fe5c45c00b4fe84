"""The seg study's preflight (`dpmed.preflight`): one probe per cell, run in a child process,
that steps the job `dpmed.seg.run.prepare` builds on random stand-in data of the configured
sizes, and σ calibrated by the runner's `Plan` on counts-only data."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dpmed.config.grid import Job
from dpmed.data.registry import DATASET_REGISTRY, eval_classes
from dpmed.preflight.study import (
    RTOL,
    Calibration,
    ProbePart,
    StudyProbe,
    job_context,
    parameters,
    probe_job,
    steady,
    timed,
)
from dpmed.privacy import accounting
from dpmed.seg import run as seg_run
from dpmed.seg.attack import image_losses
from dpmed.seg.data import SPLITS, SegData, Split
from dpmed.seg.evaluate import evaluate
from dpmed.seg.sizing import forward_batch_size, scoring_batch_size


def seg_data(
    cfg: Mapping[str, Any], dataset: str, seed: int, size: tuple[int, int] | None = None
) -> SegData:
    """Random `SegData` with the configured split counts (`DatasetEntry.split_images`) at
    `size` (default: the configured input size), images in [0, 1] and masks over all
    classes. The cost of a step does not depend on pixel values."""
    entry = DATASET_REGISTRY[dataset]
    height, width = size if size is not None else tuple(int(s) for s in cfg["size"])
    n_classes = int(entry.n_classes)
    generator = torch.Generator().manual_seed(seed)
    splits = {}
    for name, n in zip(SPLITS, entry.split_images(cfg), strict=True):
        images = torch.rand((n, 1, height, width), generator=generator)
        masks = torch.randint(0, n_classes, (n, height, width), generator=generator)
        splits[name] = Split(images, masks)
    return SegData(dataset, splits, n_classes, eval_classes(dataset, n_classes))


def probe_seg(spec: dict[str, Any]) -> dict[str, Any]:
    """`steps` training steps of the seg runner, one validation batch and one attack batch."""
    job = probe_job(spec, Path(spec["work_dir"]))
    dataset = job.wildcards["dataset"]
    prepared = seg_run.prepare(job, seg_data(spec["config"]["data"][dataset], dataset, job.seed))
    device, data, plan, net = prepared.device, prepared.data, prepared.plan, prepared.net
    setup, state = prepared.setup, prepared.state
    batches, times = iter(setup.loader), []
    for _ in range(int(spec["steps"])):
        batch = next(batches, None)
        if batch is None:  # an epoch has fewer batches than the probe's steps
            batches = iter(setup.loader)
            batch = next(batches)
        one = replace(setup, loader=[batch])
        times.append(timed(lambda one=one: seg_run.train_epoch(one, plan, state, 0, device),
                           device))  # fmt: skip
    head = Split(data.splits["val"].images[: plan.batch_size],
                 data.splits["val"].masks[: plan.batch_size])  # fmt: skip
    net.eval()
    eval_batch = forward_batch_size(plan.params)
    evals = [timed(lambda: evaluate(net, plan.morph, head, data.eval_classes, eval_batch,
                                    device, hd95=False), device) for _ in range(2)]  # fmt: skip
    attack_batch = scoring_batch_size(plan.morph, plan.params)
    part = Split(head.images[:attack_batch], head.masks[:attack_batch])
    weight = float(job.params["dice_weight"])
    attacks = [timed(lambda: image_losses(net, plan.morph, part, weight, attack_batch, device),
                     device) for _ in range(2)]  # fmt: skip
    return {
        "step_seconds": times,
        "seconds_per_step": steady(times),
        "eval_seconds_per_batch": steady(evals),
        "attack_seconds_per_batch": steady(attacks),
        "attack_batch": attack_batch,
        "sigma": setup.sigma,
        "parameters": parameters(net),
    }


_COUNTS_ONLY: dict[tuple[str, str, int], SegData] = {}


def _counts_only(dataset: str, cfg: Mapping[str, Any], depth: int) -> SegData:
    """Seg data with the configured counts at 2^depth pixels (what `Plan` needs), cached."""
    key = (dataset, json.dumps(cfg, sort_keys=True, default=str), depth)
    if key not in _COUNTS_ONLY:
        _COUNTS_ONLY[key] = seg_data(cfg, dataset, seed=0, size=(2**depth, 2**depth))
    return _COUNTS_ONLY[key]


def calibrate(config: Mapping[str, Any], job: Job, eps: float) -> Calibration:
    """σ from the job's `Plan` (q = batch/N_train, epochs·⌊1/q⌋ steps) with its accountant,
    checked by `accounting.epsilon`."""
    dataset, params = job.wc["dataset"], job.params
    data = _counts_only(dataset, config["data"][dataset], int(params["depth"]))
    plan = seg_run.Plan.of(job_context(job), data)
    steps = plan.epochs * plan.steps_per_epoch
    delta, accountant = float(params["delta"]), params["accountant"]
    sigma = accounting.noise_multiplier(eps, delta, plan.q, steps, accountant)
    spent = accounting.epsilon([(sigma, plan.q, steps)], delta, accountant)
    return Calibration(eps, sigma, sigma, spent, spent <= eps * (1 + RTOL),
                       f"q={plan.q:.4g}, steps={steps}, {accountant}")  # fmt: skip


PROBE = StudyProbe(parts=(ProbePart("", "seg"),), probes={"seg": probe_seg}, calibrate=calibrate)
