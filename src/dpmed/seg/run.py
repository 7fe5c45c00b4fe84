"""Train one seg job {dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed} (paper 002 §3–4).

Private runs (finite ε, a bounded clip rule): DP-SGD through `dpmed.privacy.dpsgd` with Poisson
sampling at q = min(1, batch_size/N), int(1/q) sampled batches per epoch, one accounted step
per batch (an empty batch is a noise-only step), noise multiplier σ calibrated so that the
configured accountant gives ε ≤ target after all planned steps at `delta`. Non-private runs
(clip none, ε inf) train without Opacus on shuffled batches of `batch_size`, minimising the
mean of the same per-sample losses. DP-Morph (`dpmed.seg.morph_ops`) transforms the logits
before the loss and at evaluation; for adaptive morphology the policy is computed from the
final map and applied to every deep-supervision map. A swept clip wildcard
(`flat-C0.5-lr0.001`) names the rule; its clip_norm and lr already arrive in the params.

Outputs in the job folder: config.json (`dpmed.runtime.run_config`), metrics.json (test
Dice/HD95/MAE, COVID S_α/E_φ, final val Dice, training seconds), privacy.json, model.pt (with
its build arguments), and in diagnostics/ the non-private diagnostics, computed from the
training data outside the DP mechanism and never to be released with a DP model (privacy.json
`not_covered`): history.csv (per epoch: training loss, val Dice (+ per class), ε spent,
seconds), morph_log.csv (adaptive runs: per epoch and class the mean thickness, thresholds and
share of each operation; header only otherwise), alignment.csv (private runs: per non-empty
step the cosine between the scaled pre-noise and the true mean gradient, batch size, clipped
share; header only otherwise). The job's `runtime.Checkpoint` is saved every epoch and removed
once all outputs exist.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, TensorDataset

from dpmed.checkpoint import Checkpoint
from dpmed.config.grid import common_seed
from dpmed.config.wildcards import parse_eps
from dpmed.errors import ConfigError
from dpmed.io import write_csv, write_json
from dpmed.models import build_model, model_arguments, save_model
from dpmed.privacy import accounting
from dpmed.privacy.clipping import ClipRule
from dpmed.privacy.grad_sample_mode import resolve_grad_sample_mode
from dpmed.privacy.mechanisms import NOISE_SEEDED
from dpmed.privacy.record import PrivacyRecord
from dpmed.runtime import JobContext, Progress
from dpmed.seg.data import SegData, load_seg_data
from dpmed.seg.diagnostics import MORPH_COLUMNS, AlignmentLog, MorphLog
from dpmed.seg.evaluate import evaluate, morph_output
from dpmed.seg.grid import STRUCTURE_DATASETS, clip_rule, invalid
from dpmed.seg.losses import per_sample_loss
from dpmed.seg.morphology import MorphSpec, parse_morph
from dpmed.seg.outputs import ALIGNMENT, HISTORY, MORPH_LOG
from dpmed.seg.privacy import COVERS, NOT_COVERED
from dpmed.seg.sizing import forward_batch_size
from dpmed.tracking import tracker

if TYPE_CHECKING:
    from dpmed.privacy.dpsgd import DPSGD


def run(job: JobContext) -> dict[str, Any]:
    """Run (or resume) one seg job and write its outputs; returns the metrics dict."""
    checkpoint = job.checkpoint("seg")
    prepared = prepare(job, checkpoint=checkpoint)
    plan, state, setup = prepared.plan, prepared.state, prepared.setup
    job.write_config("seg", prepared.device)
    progress = Progress(f"seg {'/'.join(job.wildcards.values())}", plan.epochs, state.epoch)
    prepared.net.train()
    with tracker(job.out_dir, job.tensorboard, "epoch", state.epoch) as board:
        for epoch in range(state.epoch, plan.epochs):
            t0 = time.perf_counter()
            losses = train_epoch(setup, plan, state, epoch, prepared.device)
            seconds = time.perf_counter() - t0
            state.train_seconds += seconds
            row = epoch_row(prepared, epoch, losses, seconds)
            state.history.append(row)
            state.morph_log.close_epoch(epoch + 1)
            state.epoch = epoch + 1
            epsilon = None if setup.dp is None else row["epsilon"]
            progress.line(epoch + 1, {"loss": row["loss"], "val_dice": row["val_dice"]}, epsilon)
            checkpoint.save(prepared.saved())
            board.log(row)
    metrics = final_metrics(prepared, job)
    write_outputs(job, prepared, metrics)
    checkpoint.remove()
    return metrics


@dataclass(frozen=True)
class SegSetup:
    """What a seg job steps with before its first epoch (`prepare`).

    Args:
        device: the job's device.
        data: its data (with an audit's canaries, or a probe's stand-in data).
        plan: what its wildcards and params fix.
        net: the network on `device` (Opacus wraps it, sharing its parameters).
        arguments: the network's build arguments.
        optimizer: the plain optimizer (the DP one wraps it; checkpoints hold this one).
        generator: the data order's generator.
        state: the epochs done and their logs (fresh, or a checkpoint's).
        setup: the module, optimizer and loader the epochs step with.
    """

    device: torch.device
    data: SegData
    plan: Plan
    net: torch.nn.Module
    arguments: dict[str, Any]
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    state: TrainState
    setup: Setup

    def saved(self) -> dict[str, Any]:
        """The checkpoint state after an epoch (the Poisson sampler's generator included)."""
        state = self.state
        return {
            "epoch": state.epoch,
            "model": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "history": state.history,
            "morph_rows": state.morph_log.rows,
            "alignment_rows": state.alignment.rows,
            "accountant": self.setup.accountant_history(),
            "train_seconds": state.train_seconds,
            "empty_batches": state.empty_batches,
            "generator": self.generator.get_state(),
        }


def prepare(
    job: JobContext, data: SegData | None = None, checkpoint: Checkpoint | None = None
) -> SegSetup:
    """Start `job` (seeds, device) and build its data, plan, network, optimizer, data order
    and DP-SGD setup, drawing every seed in the order a run does: the runner, the privacy
    audit (`dpmed.seg.audit`) and the preflight probe (`dpmed.seg.probe`) all start here.

    Args:
        job: the seg job.
        data: replaces the job's processed data (an audit's canaries added, a probe's
            stand-in data); None loads it.
        checkpoint: resumed before the DP setup is built (weights, optimizer, data order,
            accountant, global RNGs); None starts fresh.
    """
    device = job.start()
    if data is None:
        data = load_seg_data(job.processed_dir, job.wildcards["dataset"])
    plan = Plan.of(job, data)
    net, arguments = build_network(job, data, device)
    optimizer = make_optimizer(net, job.params)
    generator = sampling_generator(job)
    state = TrainState() if checkpoint is None else resume(checkpoint, net, optimizer, generator)
    setup = make_setup(plan, net, optimizer, data, generator, state)
    return SegSetup(device, data, plan, net, arguments, optimizer, generator, state, setup)


@dataclass(frozen=True)
class Plan:
    """What the job's wildcards and params fix before training.

    Args:
        rule: the clipping rule with its constants.
        private: whether the job trains with DP-SGD (finite ε).
        target_eps: the configured ε (inf for non-private jobs).
        morph: the DP-Morph of the logits.
        epochs: training epochs.
        batch_size: expected Poisson batch size (private) or fixed batch size.
        q: the Poisson sampling rate min(1, batch_size/N).
        steps_per_epoch: int(1/q) sampled batches (private) or ⌈N/batch_size⌉ batches.
        mode: the per-sample-gradient mode (`none` for non-private jobs).
        params: the job's hyperparameters.
        physical_batch: the most images one forward/backward pass holds (`physical_batch`;
            None: the whole batch). A larger batch runs as chunks whose gradients add up to
            the batch's: a memory bound, the same sampled batch and the same accounted step.
    """

    rule: ClipRule
    private: bool
    target_eps: float
    morph: MorphSpec
    epochs: int
    batch_size: int
    q: float
    steps_per_epoch: int
    mode: str
    params: dict[str, Any]
    physical_batch: int | None = None

    @classmethod
    def of(cls, job: JobContext, data: SegData) -> Plan:
        """The plan of `job` on `data`; ConfigError when the cell is not a seg job or the image
        size does not divide by 2^depth."""
        wc, params = dict(job.wildcards), dict(job.params)
        reason = invalid(wc)
        if reason:
            raise ConfigError("seg.grid", f"{'/'.join(wc.values())}: {reason}")
        h, w = data.size
        factor = 2 ** int(params["depth"])
        if h % factor or w % factor:
            raise ConfigError(
                "seg.defaults.depth",
                f"image size {h}×{w} (data.{wc['dataset']}.size) is not divisible by "
                f"2^depth = {factor}",
            )
        target_eps = parse_eps(wc["eps"])
        private = not math.isinf(target_eps)
        batch_size, n_train = int(params["batch_size"]), len(data.splits["train"])
        q = min(1.0, batch_size / n_train)
        mode = resolve_grad_sample_mode(params["grad_sample_mode"], wc["model"])
        morph = parse_morph(wc["morph"], tuple(params["quantiles"]))
        physical_batch = params.get("physical_batch")
        if physical_batch is not None:
            _check_physical_batch(wc, private, mode, morph)
        constants = (float(params[key]) for key in ("clip_norm", "autos_gamma", "r"))
        return cls(
            rule=ClipRule(clip_rule(wc["clip"]), *constants),
            private=private,
            target_eps=target_eps,
            morph=morph,
            epochs=int(params["epochs"]),
            batch_size=batch_size,
            q=q,
            steps_per_epoch=int(1 / q) if private else math.ceil(n_train / batch_size),
            mode=mode if private else "none",
            params=params,
            physical_batch=None if physical_batch is None else int(physical_batch),
        )


def _check_physical_batch(wc: dict[str, str], private: bool, mode: str, morph: MorphSpec) -> None:
    """ConfigError where a batch cannot run as physical chunks with the same result."""
    cell = "/".join(wc.values())
    if private and mode != "bk":
        raise ConfigError(
            "seg.defaults.physical_batch",
            f"{cell}: physical chunks need grad_sample_mode bk or auto (got {mode})",
        )
    if morph.kind == "adaptive" and morph.scope == "batch":
        raise ConfigError(
            "seg.defaults.physical_batch",
            f"{cell}: adaptive DP-Morph over the batch takes its thresholds from the whole "
            "batch; it cannot run in physical chunks (use the per-image variant, or no "
            "physical_batch in this block)",
        )


def build_network(
    job: JobContext, data: SegData, device: torch.device
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The job's network on `device` and its build arguments (from the params it declares).

    The initial weights come from the seed block's common seed (`common_seed`, role `init`):
    every clip rule, morphology and ε of a (dataset, model, seed) block starts from the same
    network. The global RNGs (the job seed: DP noise) are left as they were.
    """
    model = job.wildcards["model"]
    available = {"in_channels": 1, "n_classes": data.n_classes, **job.params}
    arguments = model_arguments(model, available)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(common_seed("seg", job.wildcards, "init"))
        net = build_model(model, **arguments)
    return net.to(device), arguments


def sampling_generator(job: JobContext) -> torch.Generator:
    """The generator of the job's data order (Poisson batches when private, shuffled batches
    otherwise), seeded by the seed block's common seed (role `order`): runs of one block that
    sample at the same rate see the same batches. Drawn from seeds alone, it is independent of
    the data and of the noise (the job seed), so sharing it changes no run's guarantee."""
    return torch.Generator().manual_seed(common_seed("seg", job.wildcards, "order"))


def make_optimizer(net: torch.nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
    """Adam, or SGD with momentum 0.9, at the job's learning rate."""
    lr = float(params["lr"])
    if params["optimizer"] == "adam":
        return torch.optim.Adam(net.parameters(), lr=lr)
    return torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)


@dataclass
class TrainState:
    """What a checkpoint carries besides the weights: the epochs done and their logs."""

    epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    morph_log: MorphLog = field(default_factory=MorphLog)
    alignment: AlignmentLog = field(default_factory=AlignmentLog)
    accountant: list[tuple[float, float, int]] = field(default_factory=list)
    train_seconds: float = 0.0
    empty_batches: int = 0


def resume(
    checkpoint: Checkpoint,
    net: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
) -> TrainState:
    """A fresh state, or the checkpoint's with weights, optimizer and generator restored
    (`Checkpoint.load` restores the global RNGs)."""
    saved = checkpoint.load()
    if saved is None:
        return TrainState()
    net.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["generator"])
    state = TrainState(
        epoch=saved["epoch"],
        history=saved["history"],
        alignment=AlignmentLog(saved["alignment_rows"]),
        accountant=[tuple(h) for h in saved["accountant"]],
        train_seconds=saved["train_seconds"],
        empty_batches=saved["empty_batches"],
    )
    state.morph_log.rows = saved["morph_rows"]
    print(f"resuming {checkpoint.path.parent} after epoch {state.epoch}", flush=True)
    return state


@dataclass
class Setup:
    """The module, optimizer and loader a job steps with: Opacus' wrappers for DP-SGD (`dp`),
    the plain network otherwise. `inject` (privacy audits only, `dpmed.seg.audit`)
    gets the DP optimizer's parameters after every backward pass, before the step, to add
    per-sample gradient rows."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: DataLoader
    dp: DPSGD | None = None
    sigma: float | None = None
    inject: Callable[[list[torch.nn.Parameter]], None] | None = None

    def accountant_history(self) -> list[tuple[float, float, int]]:
        return [] if self.dp is None else list(self.dp.engine.accountant.history)


def make_setup(
    plan: Plan,
    net: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: SegData,
    generator: torch.Generator,
    state: TrainState,
) -> Setup:
    """DP-SGD with σ calibrated to the target ε over all planned steps (the accountant resumed
    from `state`), or plain shuffled batches for a non-private job."""
    train = TensorDataset(data.splits["train"].images, data.splits["train"].masks)
    if not plan.private:
        loader = DataLoader(train, batch_size=plan.batch_size, shuffle=True, generator=generator)
        return Setup(net, optimizer, loader)
    # Opacus (about 2 s to import) only where a job trains privately
    from dpmed.privacy.dpsgd import ScaledPrivacyEngine

    params = plan.params
    planned_steps = plan.epochs * plan.steps_per_epoch
    delta, accountant = float(params["delta"]), params["accountant"]
    sigma = accounting.noise_multiplier(plan.target_eps, delta, plan.q, planned_steps, accountant)
    engine = ScaledPrivacyEngine(plan.rule, accountant=accountant)
    engine.accountant.history = list(state.accountant)
    dp = engine.make_private_poisson(
        net,
        optimizer,
        train,
        sample_rate=plan.q,
        noise_multiplier=sigma,
        grad_sample_mode=plan.mode,
        generator=generator,
    )
    return Setup(dp.module, dp.optimizer, dp.loader, dp, sigma)


def train_epoch(
    setup: Setup, plan: Plan, state: TrainState, epoch: int, device: torch.device
) -> list[float]:
    """One pass over the loader (epoch is 0-based); returns the per-sample training losses."""
    dice_weight = float(plan.params["dice_weight"])
    losses: list[float] = []
    for batch, (x, y) in enumerate(setup.loader):
        setup.optimizer.zero_grad()
        if len(y) == 0:
            setup.dp.step_empty(setup.inject)
            state.empty_batches += 1
            continue
        x, y = x.to(device), y.to(device)
        chunk = plan.physical_batch or len(y)
        if chunk < len(y):
            chunks = _chunk_losses(
                setup.module, plan.morph, state, x, y, chunk, dice_weight, losses
            )
            if setup.dp is not None:
                setup.dp.backward_chunks(chunks)
            else:  # the batch mean, one chunk's share at a time
                for loss in chunks:
                    (loss.sum() / len(y)).backward()
        else:
            loss = _batch_loss(setup.module, plan.morph, state, x, y, dice_weight)
            losses.extend(loss.detach().cpu().tolist())
            if setup.dp is not None:
                setup.dp.backward(loss)
            else:
                loss.mean().backward()
        if setup.dp is not None and setup.inject is not None:
            setup.inject(setup.dp.optimizer.params)
        setup.optimizer.step()
        if setup.dp is not None:
            step = epoch * plan.steps_per_epoch + batch + 1
            state.alignment.add(epoch + 1, step, setup.dp.optimizer.last_alignment)
    return losses


def _chunk_losses(
    module: torch.nn.Module,
    morph: MorphSpec,
    state: TrainState,
    x: torch.Tensor,
    y: torch.Tensor,
    chunk: int,
    dice_weight: float,
    into: list[float],
) -> Iterator[torch.Tensor]:
    """The per-sample losses of batch (x, y), `chunk` images at a time, each forward pass run
    only when its chunk is asked for (after the previous chunk's backward pass); each chunk's
    values are also appended to `into`."""
    for start in range(0, len(y), chunk):
        part = slice(start, start + chunk)
        loss = _batch_loss(module, morph, state, x[part], y[part], dice_weight)
        into.extend(loss.detach().cpu().tolist())
        yield loss


def _batch_loss(
    module: torch.nn.Module,
    morph: MorphSpec,
    state: TrainState,
    x: torch.Tensor,
    y: torch.Tensor,
    dice_weight: float,
) -> torch.Tensor:
    """The per-sample loss [B] of one forward pass on (x, y), DP-Morph applied and logged."""
    output, assignment = morph_output(morph, module(x))
    if assignment is not None:
        state.morph_log.add(assignment)
    return per_sample_loss(output, y, dice_weight)


def evaluate_split(
    prepared: SegSetup, split: str, hd95: bool = False, structure: bool = False
) -> dict[str, Any]:
    """`evaluate` on one split of the job's data, in passes of `forward_batch_size` images."""
    plan, data = prepared.plan, prepared.data
    return evaluate(
        prepared.net, plan.morph, data.splits[split], data.eval_classes,
        forward_batch_size(plan.params), prepared.device, hd95=hd95, structure=structure,
    )  # fmt: skip


def epoch_row(
    prepared: SegSetup, epoch: int, losses: list[float], seconds: float
) -> dict[str, Any]:
    """history.csv's row of `epoch` (0-based): loss, validation Dice (+ per class), ε spent."""
    val = evaluate_split(prepared, "val")
    plan = prepared.plan
    history = prepared.setup.accountant_history()
    row = {
        "epoch": epoch + 1,
        "loss": float(np.mean(losses)) if losses else math.nan,
        "val_dice": val["dice"],
        "epsilon": (
            accounting.epsilon(history, float(plan.params["delta"]), plan.params["accountant"])
            if plan.private
            else math.inf
        ),
        "seconds": seconds,
    }
    return row | {f"val_dice_c{c}": v for c, v in val["dice_per_class"].items()}


def final_metrics(prepared: SegSetup, job: JobContext) -> dict[str, Any]:
    """metrics.json: final validation Dice, test scores (S_α, E_φ where the dataset has them),
    training seconds; NaN/inf become null."""
    plan, data = prepared.plan, prepared.data
    val = evaluate_split(prepared, "val")
    structure = job.wildcards["dataset"] in STRUCTURE_DATASETS
    test = evaluate_split(prepared, "test", hd95=True, structure=structure)
    metrics = {
        "wildcards": dict(job.wildcards),
        "grad_sample_mode": plan.mode,
        "epochs": plan.epochs,
        "train_seconds": prepared.state.train_seconds,
        "val_dice": val["dice"],
        "eval_classes": list(data.eval_classes),
        "n_train": len(data.splits["train"]),
        **test,
    }
    return _finite(metrics)


def privacy_record(
    plan: Plan,
    sigma: float | None,
    empty_batches: int,
    history: list[tuple[float, float, int]],
    n_train: int,
) -> PrivacyRecord:
    """The privacy.json record of a seg run from its plan (rule, DP-Morph, q, ε, mode, params),
    calibrated σ (None when non-private), empty Poisson batches, the accountant's (σ, q,
    steps) history to account (the privacy audit passes the calibrated σ where the noise it
    added was scaled) and the training set size."""
    params, rule, spec, q = plan.params, plan.rule, plan.morph, plan.q
    adjacency = "sample-level (add/remove one image)"
    if not plan.private:
        return PrivacyRecord.non_private(
            "none: non-private training (no clipping, no noise)",
            adjacency,
            "fixed-size",
            extra={"batch_size": int(params["batch_size"])},
        )
    delta = float(params["delta"])
    by_acc = {name: accounting.epsilon(history, delta, name) for name in accounting.ACCOUNTANTS}
    reasons = []
    if spec.kind == "adaptive" and spec.scope == "batch":
        reasons.append(
            "adaptive DP-Morph with batch-level thresholds (paper 002 §3.2): each image's "
            "morphology depends on the other images of the batch, so one image can change "
            "every per-sample gradient and the sensitivity C of the sum does not hold; "
            "the morph variant adaptive-vN-s uses the per-image (sound) policy "
            "(docs/privacy.md, finding 11)"
        )
    return PrivacyRecord(
        mechanism=f"DP-SGD, Poisson-subsampled Gaussian, {rule.name} clipping "
        "(per-sample scale factors, every scaled gradient norm ≤ C, noise std σ·C)",
        adjacency=adjacency,
        sampling="poisson",
        accountant=params["accountant"],
        epsilon=by_acc[params["accountant"]],
        delta=delta,
        guarantee="paper-approximation" if reasons else "dp",
        clip_norm=rule.clip_norm,
        sample_rate=q,
        steps=int(sum(n for _, _, n in history)),
        noise_multipliers=[float(sigma)],
        target_epsilon=plan.target_eps,
        epsilon_by_accountant=by_acc,
        reasons=reasons,
        covers=COVERS,
        not_covered=list(NOT_COVERED),
        extra={
            "clip_rule": rule.name,
            "autos_gamma": rule.gamma,
            "r": rule.r,
            "grad_sample_mode": plan.mode,
            "expected_batch_size": q * n_train,
            "empty_batches": empty_batches,
            "noise_source": NOISE_SEEDED,
        },
    )


def write_outputs(job: JobContext, prepared: SegSetup, metrics: dict[str, Any]) -> None:
    """Every output file of the job folder (the diagnostics in diagnostics/), metrics.json last."""
    out, plan, setup, state = Path(job.out_dir), prepared.plan, prepared.setup, prepared.state
    history = pd.DataFrame(state.history)
    history["epsilon"] = history["epsilon"].astype(float)
    write_csv(out / HISTORY, history)
    write_csv(out / MORPH_LOG, pd.DataFrame(state.morph_log.rows, columns=MORPH_COLUMNS))
    write_csv(out / ALIGNMENT, state.alignment.frame())
    record = privacy_record(
        plan, setup.sigma, state.empty_batches, setup.accountant_history(), metrics["n_train"]
    )
    record.write(out / "privacy.json", job.wildcards["dataset"])
    # The backbone file only initialises training; the saved weights replace it.
    saved_arguments = {k: v for k, v in prepared.arguments.items() if k != "backbone_weights"}
    save_model(out / "model.pt", job.wildcards["model"], saved_arguments, prepared.net)
    write_json(out / "metrics.json", metrics)


def _finite(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf floats become None."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
