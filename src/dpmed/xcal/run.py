"""XCal-FL study job (paper 001): in-process FedAvg over clients of one MedMNIST dataset.

One run = one cell of the xcal grid (`dpmed.xcal.spec`), trained by the federation
`dpmed.xcal.federation` builds: the clients train on their shares of the training split under
the cell's method; each round the server samples m of the K clients (paper 001 App. A;
`clients_per_round`, all K when m ≥ K), averages their tensors weighted by sample count
(FedAvg) and evaluates the global model on the test split (macro F1, accuracy; ROAD every
`road_every` rounds and after the last, on a fixed test subsample shared by every run of the
dataset).

Outputs in the run folder: rounds.csv (round, f1, accuracy, epsilon = max over clients of the
proven ε bound so far, eps_spent = max over clients of the ε spent so far, the same accounting
for every method (`Method.realised_epsilon`), road = the paper's ROAD in %, road_combined,
seconds), metrics.json,
privacy.json, road.json, gradcam.npz (Grad-CAM examples of the final model), model.pt (the
final global model) and config.json (`dpmed.runtime.run_config`). A fingerprinted checkpoint
after every round lets a killed run resume; it is removed once the outputs exist.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dpmed.checkpoint import Checkpoint
from dpmed.config.wildcards import parse_eps
from dpmed.explain.gradcam import quiet
from dpmed.io import write_json
from dpmed.runtime import JobContext, Progress
from dpmed.tracking import tracker
from dpmed.xcal.client import Client
from dpmed.xcal.federation import (
    Federation,
    TrainState,
    prepare,
    run_label,
    train_round,
    write_model_outputs,
)
from dpmed.xcal.privacy import privacy_record


def run(job: JobContext) -> dict:
    """Train one grid cell and write its outputs (module docstring); returns metrics.json."""
    device, fed = prepare(job)
    job.write_config("xcal", device)
    checkpoint = job.checkpoint("xcal")
    state = resume(checkpoint, fed, device)
    rounds = job.params["rounds"]
    progress = Progress(run_label(job.wildcards), rounds, start=state.rounds_done)
    with tracker(job.out_dir, job.tensorboard, "round", state.rounds_done) as board:
        for r in range(state.rounds_done, rounds):
            road_due = (r + 1) % job.params["road_every"] == 0 or r + 1 == rounds
            scores = train_round(fed, state, road_due)
            checkpoint.save(  # what `resume` needs (the fingerprint and RNGs are `save`'s)
                {
                    "global": state.global_state,
                    "rows": state.rows,
                    "elapsed": state.elapsed,
                    "last_road": state.last_road,
                    "clients": [c.state() for c in fed.clients],
                }
            )
            progress.line(r + 1, scores, state.rows[-1]["epsilon"])
            board.log(state.rows[-1])
    metrics = write_outputs(job, fed, state)
    checkpoint.remove()
    return metrics


# ---------------------------------------------------------------------------------- resume


def resume(checkpoint: Checkpoint, fed: Federation, device: torch.device) -> TrainState:
    """The job's checkpointed state with the global weights, clients and global RNGs
    restored, or a fresh one (no checkpoint, or one of another configuration)."""
    saved = checkpoint.load()
    if saved is None:
        return TrainState.start(fed.net)
    global_state = {k: v.to(device) for k, v in saved["global"].items()}
    fed.net.load_state_dict(global_state)  # a run stopped after its last round evaluates these
    for client, client_state in zip(fed.clients, saved["clients"], strict=True):
        client.load_state(client_state)
    state = TrainState(global_state, saved["rows"], saved["elapsed"], saved["last_road"])
    print(f"resuming {checkpoint.path.parent} after round {state.rounds_done}", flush=True)
    return state


# ---------------------------------------------------------------------------------- outputs


def write_outputs(job: JobContext, fed: Federation, state: TrainState) -> dict:
    """Write privacy.json, rounds.csv, road.json, gradcam.npz, model.pt and metrics.json."""
    eps = parse_eps(job.wildcards["eps"])
    record = privacy_record(fed.accounts, fed.method, eps, job.params)
    out_dir = Path(job.out_dir)
    record.write(out_dir / "privacy.json", job.wildcards["dataset"])
    road = write_model_outputs(job, fed, state)
    metrics = run_metrics(job.wildcards, fed, state.rows, road, record.epsilon)
    write_json(out_dir / "metrics.json", metrics)
    return metrics


EFFICIENCY_MIN_EPS_RISE = 0.01
"""Smallest rise of ε between the first and last evaluated round, as a fraction of the last ε,
over which a slope is reported. Below it ε has effectively not moved (a client that spent its
whole budget in round 1 moves the max-over-clients ε by ~1e-7 of accountant round-off) and the
ratio would only amplify that round-off (a ΔF1 of −0.02 over Δε = 7e-7 reads −3·10⁴)."""


def efficiency(values: list[float | None], eps: list[float | None]) -> float | None:
    """(last − first) / (ε_last − ε_first) over the rounds that have a value (None if ε is
    undefined or rose by less than EFFICIENCY_MIN_EPS_RISE of ε_last)."""
    pairs = [(v, e) for v, e in zip(values, eps, strict=True) if v is not None and e is not None]
    if len(pairs) < 2:
        return None
    (first, eps_first), (last, eps_last) = pairs[0], pairs[-1]
    if not eps_last - eps_first > EFFICIENCY_MIN_EPS_RISE * eps_last:
        return None
    return (last - first) / (eps_last - eps_first)


def run_metrics(
    wildcards: dict[str, str],
    fed: Federation,
    rows: list[dict],
    road: dict,
    epsilon: float | None,
) -> dict:
    """metrics.json: the cell, final scores, the final proven ε (`epsilon`), the efficiencies
    ΔF1/Δε and ΔROAD/Δε over the spent-ε trajectory (for every method the RDP of what ran, so
    XCal-FL's slope is not flattened by its whole-run bound), step counts and times, the time
    of two inference-mode forward passes (paper 001 §8's overhead measure,
    `forward_pair_seconds`), the σs and signals the clients used."""
    clients = fed.accounts
    steps = sum(c.stats.steps for c in clients)
    seconds = sum(c.stats.seconds for c in clients)
    sigmas = [s for c in clients for s in c.stats.sigmas]
    signals = [s for c in clients for s in c.stats.signals]
    eps = [r["eps_spent"] for r in rows]
    last = rows[-1]
    return {
        **{k: wildcards[k] for k in ("dataset", "model", "method", "shift", "clients", "eps")},
        "f1": last["f1"],
        "accuracy": last["accuracy"],
        "epsilon": epsilon,
        "road": road["road"],
        "road_combined": road["combined"],
        "road_random": road["random"]["road"],
        "morf_mean": float(np.mean(road["morf"])),
        "lerf_mean": float(np.mean(road["lerf"])),
        "f1_per_eps": efficiency([r["f1"] for r in rows], eps),
        "road_per_eps": efficiency([r["road"] for r in rows], eps),
        "steps": steps,
        "step_seconds": seconds / steps if steps else None,
        "forward_pair_seconds": forward_pair_seconds(
            fed.wrapped if fed.wrapped is not None else fed.net, fed.clients
        ),
        "seconds": last["seconds"],
        "sigma_mean": float(np.mean(sigmas)) if sigmas else None,
        "sigma_min": float(np.min(sigmas)) if sigmas else None,
        "sigma_max": float(np.max(sigmas)) if sigmas else None,
        "signal_mean": float(np.mean(signals)) if signals else None,
        "halted_clients": sum(1 for c in clients if fed.method.halted(c)),
        "gradcam_layer": fed.evaluation.layer,
        "client_sizes": [c.n for c in clients],
    }


# ---------------------------------------------------------------------------------- timing
# Paper 001 §8 counts XCal-FL's extra cost per DP-SGD step as two inference-mode forward passes
# (the clean and the masked image). Our XCal-FL step costs more than that: a Grad-CAM forward
# and backward pass plus the masked forward, on a Poisson sample of its own. A run times the
# paper's measure after training, on the final global model, so the runtime table gives both.

REPEATS = 3  # timed repetitions after one warm-up pass; their median counts


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pair_seconds(module: nn.Module, x: torch.Tensor) -> float:
    """Median wall-clock seconds of two forward passes of `module` on `x` in eval mode under
    `torch.inference_mode` (Opacus hooks off), after one warm-up pass."""
    samples = []
    with quiet(module) as net, torch.inference_mode():
        net(x)
        for _ in range(REPEATS):
            _synchronize(x.device)
            start = time.perf_counter()
            net(x)
            net(x)
            _synchronize(x.device)
            samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def forward_pair_seconds(module: nn.Module, clients: Sequence[Client]) -> float | None:
    """`pair_seconds` on the first ⌈q·n⌉ images (the expected Poisson batch) of the first
    client that trained (the clients' expected batches all have about the configured size, so
    one suffices); None when no client trained."""
    trained = [c for c in clients if c.account.rounds]
    if not trained:
        return None
    client, account = trained[0], trained[0].account
    return pair_seconds(module, client.x[: max(1, int(np.ceil(account.q * account.n)))])
