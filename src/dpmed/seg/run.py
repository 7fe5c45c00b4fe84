"""Train one seg job: {dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed} (paper 002 §3–4).

Private runs (finite ε, clip ≠ none): DP-SGD through `dpmed.privacy.dpsgd` with Poisson
sampling at q = min(1, batch_size/N), int(1/q) sampled batches per epoch, one accounted step
per batch (an empty batch is a noise-only step), noise multiplier σ calibrated so that the
configured accountant gives ε ≤ target after all planned steps at `delta`. Non-private runs
(clip none, ε inf) train without Opacus on shuffled batches of `batch_size`, minimising the
mean of the same per-sample losses. DP-Morph (`dpmed.seg.morphology`) transforms the logits
before the loss and at evaluation; for adaptive morphology the policy is computed from the
final map and applied to every deep-supervision map.

The clip wildcard names the rule, optionally with a sweep suffix (`flat-C0.5-lr0.001`); the
swept clip_norm and lr already arrive in `params`.

Outputs in `out_dir`: metrics.json (test Dice/HD95/MAE, COVID S_α/E_φ, final val Dice,
training seconds), history.csv (per epoch: loss, val Dice (+ per class), ε spent, seconds),
morph_log.csv (adaptive runs: per epoch and class the mean thickness, thresholds and share of
each operation; header only otherwise), alignment.csv (private runs: per non-empty step the
cosine between the scaled pre-noise and the true mean gradient, batch size, clipped share;
header only otherwise; `dpmed.seg.alignment`), privacy.json, model.pt. `checkpoint.pt` is written
every epoch and removed once all outputs exist; a killed job resumes from it when its
fingerprint (wildcards, params, seed) matches.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader

from dpmed.config.wildcards import parse_eps
from dpmed.errors import ConfigError
from dpmed.io import write_csv, write_json
from dpmed.models import build_model, model_arguments, save_model
from dpmed.privacy import accounting
from dpmed.privacy.clipping import ClipRule
from dpmed.privacy.dpsgd import ScaledPrivacyEngine, resolve_grad_sample_mode
from dpmed.runtime import Progress, load_checkpoint, save_checkpoint, seed_everything, select_device
from dpmed.seg.alignment import AlignmentLog
from dpmed.seg.data import SegData, load_seg_data
from dpmed.seg.evaluate import evaluate, morph_output
from dpmed.seg.losses import per_sample_loss
from dpmed.seg.morph_log import MORPH_COLUMNS, MorphLog
from dpmed.seg.morphology import parse_morph
from dpmed.seg.privacy import seg_privacy_record
from dpmed.seg.spec import clip_rule

CHECKPOINT = "checkpoint.pt"


def fingerprint(wildcards: Mapping[str, str], params: Mapping[str, Any], seed: int) -> str:
    """Stable hash of what defines a job (a checkpoint of another job is never resumed)."""
    text = json.dumps({"wc": dict(wildcards), "params": dict(params), "seed": seed}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_params(params: Mapping[str, Any], data: SegData) -> None:
    h, w = data.size
    factor = 2 ** int(params["depth"])
    if h % factor or w % factor:
        raise ConfigError(
            "seg.params.depth", f"image size {h}×{w} is not divisible by 2^depth = {factor}"
        )


def train_seg(
    processed_dir: str | Path,
    out_dir: str | Path,
    wildcards: Mapping[str, str],
    params: Mapping[str, Any],
    seed: int,
    device: str = "auto",
    threads: int | None = None,
) -> dict[str, Any]:
    """Run (or resume) one job and write its outputs; returns the metrics dict."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wc = dict(wildcards)
    dataset, model_name, clip = wc["dataset"], wc["model"], wc["clip"]
    rule_name = clip_rule(clip)
    target_eps = parse_eps(wc["eps"])
    private = not math.isinf(target_eps)
    if private == (rule_name == "none"):
        raise ConfigError("seg.grid", f"clip '{clip}' with eps {wc['eps']}: none ⇔ eps inf")
    seed_everything(seed, threads)
    dev = select_device(device)
    data = load_seg_data(processed_dir, dataset)
    _check_params(params, data)
    spec = parse_morph(wc["morph"], tuple(params["quantiles"]))
    if spec.kind == "adaptive" and data.n_classes < 8:
        raise ConfigError(
            "seg.grid.morphs", f"adaptive DP-Morph needs the retinal layers of duke, not {dataset}"
        )

    arguments = model_arguments(
        model_name, {"in_channels": 1, "n_classes": data.n_classes, **params}
    )
    net = build_model(model_name, **arguments).to(dev)
    lr = float(params["lr"])
    opt = (
        torch.optim.Adam(net.parameters(), lr=lr)
        if params["optimizer"] == "adam"
        else torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    )
    epochs, batch_size, delta = (
        int(params["epochs"]),
        int(params["batch_size"]),
        float(params["delta"]),
    )
    train = data.splits["train"]
    n_train = len(train)
    q = min(1.0, batch_size / n_train)
    steps_per_epoch = int(1 / q) if private else math.ceil(n_train / batch_size)
    planned_steps = epochs * steps_per_epoch
    generator = torch.Generator().manual_seed(seed)
    mode = resolve_grad_sample_mode(params["grad_sample_mode"], model_name) if private else "none"

    fp = fingerprint(wc, params, seed)
    ckpt = load_checkpoint(out / CHECKPOINT, "cpu")
    if ckpt is not None and (ckpt.get("fingerprint") != fp or "alignment_rows" not in ckpt):
        print(f"{out / CHECKPOINT}: from another configuration, starting afresh", flush=True)
        ckpt = None
    history: list[dict[str, Any]] = []
    morph_log = MorphLog()
    alignment = AlignmentLog()
    accountant_history: list[tuple[float, float, int]] = []
    start_epoch, train_seconds, empty_batches = 0, 0.0, 0
    if ckpt is not None:
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        history, morph_log.rows = ckpt["history"], ckpt["morph_rows"]
        alignment = AlignmentLog(ckpt["alignment_rows"])
        accountant_history = [tuple(h) for h in ckpt["accountant"]]
        start_epoch, train_seconds, empty_batches = (
            ckpt["epoch"],
            ckpt["train_seconds"],
            ckpt["empty_batches"],
        )
        generator.set_state(ckpt["generator"])
        torch.set_rng_state(ckpt["torch_rng"])
        if ckpt["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
        np.random.set_state(ckpt["numpy_rng"])
        random.setstate(ckpt["python_rng"])
        print(f"resuming {out} after epoch {start_epoch}", flush=True)

    rule = ClipRule(
        rule_name, float(params["clip_norm"]), float(params["autos_gamma"]), float(params["r"])
    )
    sigma = None
    if private:
        sigma = accounting.noise_multiplier(
            target_eps, delta, q, planned_steps, params["accountant"]
        )
        engine = ScaledPrivacyEngine(rule, accountant=params["accountant"])
        engine.accountant.history = list(accountant_history)
        dp = engine.make_private_poisson(
            net,
            opt,
            train.dataset(),
            sample_rate=q,
            noise_multiplier=sigma,
            grad_sample_mode=mode,
            generator=generator,
        )
        module, optimizer, loader = dp.module, dp.optimizer, dp.loader
    else:
        dp = None
        module, optimizer = net, opt
        loader = DataLoader(
            train.dataset(), batch_size=batch_size, shuffle=True, generator=generator
        )

    progress = Progress(f"seg {'/'.join(wc.values())}", epochs, start=start_epoch)
    net.train()
    for epoch in range(start_epoch, epochs):
        t0 = time.perf_counter()
        losses: list[float] = []
        for batch, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            if len(y) == 0:
                dp.step_empty()
                empty_batches += 1
                continue
            x, y = x.to(dev), y.to(dev)
            output, assignment = morph_output(spec, module(x))
            if assignment is not None:
                morph_log.add(assignment)
            loss = per_sample_loss(output, y, float(params["dice_weight"]))
            if dp is not None:
                dp.backward(loss)
            else:
                loss.mean().backward()
            optimizer.step()
            if dp is not None:
                step = epoch * steps_per_epoch + batch + 1
                alignment.add(epoch + 1, step, dp.optimizer.last_alignment)
            losses.extend(loss.detach().cpu().tolist())
        seconds = time.perf_counter() - t0
        train_seconds += seconds
        val = evaluate(
            net, spec, data.splits["val"], data.eval_classes, batch_size, dev, hd95=False
        )
        eps_spent = (
            accounting.epsilon(engine.accountant.history, delta, params["accountant"])
            if private
            else None
        )
        row = {
            "epoch": epoch + 1,
            "loss": float(np.mean(losses)) if losses else math.nan,
            "val_dice": val["dice"],
            "epsilon": eps_spent if private else math.inf,
            "seconds": seconds,
        }
        row |= {f"val_dice_c{c}": v for c, v in val["dice_per_class"].items()}
        history.append(row)
        morph_log.close_epoch(epoch + 1)
        progress.line(epoch + 1, {"loss": row["loss"], "val_dice": row["val_dice"]}, eps_spent)
        save_checkpoint(
            out / CHECKPOINT,
            {
                "fingerprint": fp,
                "epoch": epoch + 1,
                "model": net.state_dict(),
                "optimizer": opt.state_dict(),
                "history": history,
                "morph_rows": morph_log.rows,
                "alignment_rows": alignment.rows,
                "accountant": list(engine.accountant.history) if private else [],
                "train_seconds": train_seconds,
                "empty_batches": empty_batches,
                "generator": generator.get_state(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "numpy_rng": np.random.get_state(),
                "python_rng": random.getstate(),
            },
        )

    val = evaluate(net, spec, data.splits["val"], data.eval_classes, batch_size, dev, hd95=False)
    test = evaluate(
        net,
        spec,
        data.splits["test"],
        data.eval_classes,
        batch_size,
        dev,
        hd95=True,
        structure=dataset == "covidct",
    )
    metrics: dict[str, Any] = {
        "wildcards": wc,
        "grad_sample_mode": mode,
        "epochs": epochs,
        "train_seconds": train_seconds,
        "val_dice": val["dice"],
        "eval_classes": list(data.eval_classes),
        "n_train": n_train,
        **{k: v for k, v in test.items()},
    }
    metrics = _finite(metrics)
    history_frame = pd.DataFrame(history)
    history_frame["epsilon"] = history_frame["epsilon"].astype(float)
    write_csv(out / "history.csv", history_frame)
    write_csv(out / "morph_log.csv", pd.DataFrame(morph_log.rows, columns=MORPH_COLUMNS))
    write_csv(out / "alignment.csv", alignment.frame())
    seg_privacy_record(
        private,
        params,
        rule,
        spec,
        q,
        sigma,
        target_eps,
        empty_batches,
        mode,
        engine.accountant.history if private else [],
        n_train,
    ).write(out / "privacy.json")
    # The backbone file only initialises training; the saved weights replace it.
    saved_arguments = {k: v for k, v in arguments.items() if k != "backbone_weights"}
    save_model(out / "model.pt", model_name, saved_arguments, net)
    write_json(out / "metrics.json", metrics)
    (out / CHECKPOINT).unlink(missing_ok=True)
    return metrics


def _finite(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf floats become None."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
