"""The seg study's sizing (`dpmed.sizing`): what a training and an attack job hold and repeat,
which jobs one preflight probe measures, and how many images one forward pass holds (read by
the runner, the membership attack and the probe). Torch-free at import (the workflow reads it).

Work of one job (as `dpmed.seg.run.Plan` and `dpmed.seg.attack` run it):

- seg_train: epochs · S training steps, S = ⌊1/q⌋ sampled batches per epoch (private, q =
  min(1, B/N_train)) or ⌈N_train/B⌉; (epochs + 1) · ⌈N_val/B⌉ + ⌈N_test/B⌉ evaluation batches
  (validation after every epoch and at the end, the test split once; its HD95 is not timed).
- seg_attack: 2n images scored in batches of the attack's scoring size, n = min(N_train,
  N_val + N_test) members and as many non-members.

A distinct cell keeps the dataset (input size, images, classes), model and architecture (width,
depth, deep supervision), batch size, clip rule (non-private, or which per-sample rule) and
DP-Morph kind (none, fixed, adaptive over the batch or per image); it drops seed, ε (σ only),
morph kernel and quantiles, lr and C (a sweep's axes) and epochs (they multiply the steps, not
the cost of one). The private clip rules share one probe: each scales the B per-sample norms
by its own elementwise s(n) before the same sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpmed.config.wildcards import parse_eps
from dpmed.data.registry import DATASET_REGISTRY
from dpmed.seg.grid import attacked, clip_rule
from dpmed.seg.morphology import MorphSpec, parse_morph
from dpmed.sizing import RuleSizing, StudySizing, Work, picked

MB = 1e6
FLOAT = 4  # bytes of a float32
ARCHITECTURE = ("width", "depth", "deep_supervision", "backbone_weights")
# what a cell's tensors depend on besides the dataset, model, clip rule and DP-Morph kind
CELL_ARCHITECTURE = ("width", "depth", "deep_supervision", "batch_size", "physical_batch",
                     "grad_sample_mode")  # fmt: skip


def forward_batch_size(params: Mapping[str, Any]) -> int:
    """Images per evaluation forward pass: `batch_size`, or `physical_batch` where smaller.

    A memory bound like training's chunks: without DP-Morph, and with fixed or per-image
    DP-Morph, an image's output does not depend on the others in its pass (batch-adaptive
    DP-Morph cannot run with `physical_batch`: `dpmed.seg.run.Plan`).
    """
    batch, physical = int(params["batch_size"]), params.get("physical_batch")
    return batch if physical is None else min(batch, int(physical))


def scoring_batch_size(spec: MorphSpec, params: Mapping[str, Any]) -> int:
    """Images per scoring pass of the membership attack: 1 under batch-adaptive DP-Morph (its
    thresholds come from the pass, so each image is scored on its own), else the evaluation's
    `forward_batch_size`."""
    if spec.kind == "adaptive" and spec.scope == "batch":
        return 1
    return forward_batch_size(params)


def _parameters(wc: Mapping[str, str], hp: Mapping[str, Any]) -> int:
    from dpmed.models import parameter_count

    entry = DATASET_REGISTRY[wc["dataset"]]
    architecture = {key: hp[key] for key in ARCHITECTURE if key in hp}
    return parameter_count(wc["model"], in_channels=entry.channels, n_classes=entry.n_classes,
                           **architecture)  # fmt: skip


def _pixel_work(data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]) -> float:
    """Convolution work of one image: pixels × width² (/1e9)."""
    height, width = data[wc["dataset"]]["size"]
    return height * width * hp["width"] ** 2 / 1e9


def train_memory(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> dict[str, float]:
    """Memory features of a training job."""
    dataset, model = wc["dataset"], wc["model"]
    height, width = data[dataset]["size"]
    pixels = height * width
    total = sum(DATASET_REGISTRY[dataset].split_images(data[dataset]))
    params = _parameters(wc, hp)
    private = wc["clip"] != "none"
    # one forward/backward pass holds at most `physical_batch` images (the seg runner's chunks)
    batch = forward_batch_size(hp)
    chunked = batch < hp["batch_size"]
    activations = batch * pixels * hp["width"] / MB
    return {
        "const": 1.0,
        f"act_{model}": activations,
        # what DP-SGD's per-sample gradient computation and adaptive DP-Morph hold beside the
        # activations of ordinary training (measured at the paper's sizes by the preflight)
        "act_private": activations if private else 0.0,
        "act_adaptive": activations if wc["morph"].startswith("adaptive") else 0.0,
        "host": total * pixels * (FLOAT + 8) / MB,  # images (float32) and masks (int64)
        # per-sample gradients and their clipped copy, weights, gradient, two Adam moments;
        # chunks also keep the batch's clipped and unclipped sums
        "device": ((2 * batch if private else 0) + 4 + 2 * chunked) * params * FLOAT / MB,
    }


def attack_memory(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> dict[str, float]:
    """Memory features of an attack job: training's, but the attack only scores the trained
    model (its weights, no gradients)."""
    return train_memory(data, wc, hp) | {"device": _parameters(wc, hp) * FLOAT / MB}


def train_work(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> dict[str, Work]:
    """Training steps and evaluation batches of a training job (module docstring)."""
    n_train, n_val, n_test = DATASET_REGISTRY[wc["dataset"]].split_images(data[wc["dataset"]])
    batch, epochs = int(hp["batch_size"]), int(hp["epochs"])
    q = min(1.0, batch / n_train)
    private = math.isfinite(parse_eps(wc["eps"])) and wc["clip"] != "none"
    per_epoch = int(1 / q) if private else math.ceil(n_train / batch)
    evaluations = (epochs + 1) * math.ceil(n_val / batch) + math.ceil(n_test / batch)
    size, term = batch * _pixel_work(data, wc, hp), f"work_{wc['model']}"
    return {
        "step": Work(epochs * per_epoch, size, term, "seconds_per_step"),
        "eval_batch": Work(evaluations, size, term, "eval_seconds_per_batch"),
    }


def attack_work(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> dict[str, Work]:
    """Scoring batches of an attack job (module docstring)."""
    n_train, n_val, n_test = DATASET_REGISTRY[wc["dataset"]].split_images(data[wc["dataset"]])
    images = 2 * min(n_train, n_val + n_test)
    batch = scoring_batch_size(parse_morph(wc["morph"]), hp)
    size = batch * _pixel_work(data, wc, hp)
    return {"batch": Work(math.ceil(images / batch), size, f"work_{wc['model']}",
                          "attack_seconds_per_batch")}  # fmt: skip


def morph_scope(morph: str) -> str:
    """`none`, `fixed`, `adaptive-batch` or `adaptive-sample` (the paper's batch thresholds or
    the per-image ones, suffix `-s`)."""
    spec = parse_morph(morph)
    return f"adaptive-{spec.scope}" if spec.kind == "adaptive" else spec.kind


def shape_key(wc: Mapping[str, str], params: Mapping[str, Any]) -> tuple:
    """(dataset, model, clip rule or `none`, DP-Morph kind, architecture)."""
    rule = clip_rule(wc["clip"]) if math.isfinite(parse_eps(wc["eps"])) else "none"
    return (wc["dataset"], wc["model"], rule, morph_scope(wc["morph"]),
            picked(params, CELL_ARCHITECTURE))  # fmt: skip


def probe_key(key: tuple) -> tuple:
    """The shape key with the private clip rule dropped (one probe measures them all)."""
    dataset, model, rule, morph, arch = key
    return (dataset, model, rule != "none", morph, arch)


def cost_features(key: tuple, params: Mapping[str, Any]) -> tuple:
    """Input and network, private or not, DP-Morph kind, then the clip rule."""
    dataset, model, rule, morph, arch = key
    return (dataset, model, arch, rule != "none", morph, rule)


def sample_features(key: tuple, wc: Mapping[str, str]) -> list[str]:
    """The clip rule, DP-Morph kind and model of a job."""
    return [f"clip={wc['clip']}", f"morph={morph_scope(wc['morph'])}", f"model={wc['model']}"]


SIZING = StudySizing(
    rules={
        "seg_train": RuleSizing(train_memory, train_work, "step"),
        # seg jobs are trained then attacked, but only in blocks with the attack on
        "seg_attack": RuleSizing(attack_memory, attack_work, "batch", runs=attacked),
    },
    shape_key=shape_key,
    probe_key=probe_key,
    cost_features=cost_features,
    sample_features=sample_features,
)
