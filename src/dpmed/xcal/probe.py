"""The xcal study's preflight (`dpmed.preflight`): per cell, a child process that steps one
client of the federation `dpmed.xcal.federation.prepare` builds (on a random processed MedMNIST
folder of the configured size and counts), and one per dataset and network that times the test
evaluation and ROAD; σ calibrated by the run's own `Client`s on counts-only data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from dpmed.config.grid import Job
from dpmed.data.medmnist import dataset_info
from dpmed.data.synthetic.medmnist import class_counts
from dpmed.io import write_json, write_npz
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
from dpmed.xcal import federation as xcal_fed
from dpmed.xcal.account import ClientAccount
from dpmed.xcal.client import ClientUpdate
from dpmed.xcal.methods import XCalState, resolve
from dpmed.xcal.shifts import partition

# The evaluation is linear in its images: a head is timed and scaled (`probe_evaluation`).
ROAD_PROBE = 16  # ROAD images timed (of the configured subsample)
EVAL_PROBE = 512  # test images timed (of the test set)
SPLITS = ("train", "val", "test")


def medmnist_labels(dataset: str, n: int, seed: int, balance: str = "official") -> np.ndarray:
    """`n` labels with the synthetic generator's class counts (`balance`: its
    `synthetic.class_balance`, official train proportions or uniform)."""
    counts = class_counts(dataset_info(dataset), n, balance)
    labels = np.repeat(np.arange(len(counts)), counts)
    return np.random.default_rng(seed).permutation(labels).astype(np.int64)


def write_medmnist(config: Mapping[str, Any], dataset: str, folder: Path) -> Path:
    """A processed MedMNIST folder (train/val/test.npz, meta.json) of random images at the
    configured size and counts (the cost of a step does not depend on pixel values)."""
    cfg = config["data"][dataset]
    info, size = dataset_info(dataset), int(cfg["size"])
    rng = np.random.default_rng(0)
    balance = cfg["synthetic"].get("class_balance", "official")
    for split, n in zip(SPLITS, cfg["synthetic"]["counts"], strict=True):
        images = rng.integers(0, 256, (n, size, size, info.channels), dtype=np.uint8)
        labels = medmnist_labels(dataset, n, 0, balance)
        write_npz(folder / f"{split}.npz", images=images, labels=labels)
    write_json(folder / "meta.json", {"dataset": dataset, "n_classes": info.n_classes,
                                      "channels": info.channels, "size": size})  # fmt: skip
    return folder


def probe_steps(spec: dict[str, Any]) -> dict[str, Any]:
    """Local DP (or SGD) steps of one sampled client through `Client.train_round` (a first
    round of one step, then a round of `steps` − 1 steps, timed by the client's own step
    clock) and the server's FedAvg. The evaluation is `probe_evaluation`'s."""
    device, fed = xcal_fed.prepare(probe_job(spec, Path(spec["data_dir"])))
    history = xcal_fed.TrainState.start(fed.net)
    client = fed.clients[fed.schedule[0][0]]
    account = client.account
    times, walls = [], []
    for steps in (1, max(1, int(spec["steps"]) - 1)):
        account.steps_per_epoch = steps  # bounded rounds; q and σ stay the configured ones
        done, seconds = account.stats.steps, account.stats.seconds
        walls.append(timed(lambda: client.train_round(fed.net, fed.wrapped,
                                                      history.global_state), device))  # fmt: skip
        taken = account.stats.steps - done
        times += [(account.stats.seconds - seconds) / max(1, taken)] * taken
        overhead = walls[-1] - (account.stats.seconds - seconds)
    state = {k: v.detach().clone() for k, v in fed.net.state_dict().items()}
    update = ClientUpdate(state, account.n, {})
    aggregate = timed(lambda: fed.net.load_state_dict(xcal_fed.fedavg([update])), device)
    return {
        "step_seconds": times,
        "seconds_per_step": steady(times),
        "round_overhead_seconds": overhead + aggregate,
        "sigma": fed.method.reference_sigma(account),
        "parameters": parameters(fed.net),
    }


def probe_evaluation(spec: dict[str, Any]) -> dict[str, Any]:
    """Seconds of one whole-test-set evaluation and one ROAD of the configured subsample of
    the federation's global model, each timed on a head of its images (`EVAL_PROBE`,
    `ROAD_PROBE`) and scaled linearly. The method, shift, clients and ε do not change this
    work, so the xcal cells of one dataset and network share it."""
    device, fed = xcal_fed.prepare(probe_job(spec, Path(spec["data_dir"])))
    evaluation = fed.evaluation
    head = replace(evaluation, x=evaluation.x[:EVAL_PROBE], y=evaluation.y[:EVAL_PROBE])
    scores = timed(head.scores, device) * len(evaluation.y) / max(1, len(head.y))
    part = replace(evaluation, road_idx=evaluation.road_idx[:ROAD_PROBE])
    road = timed(part.road, device) * len(evaluation.road_idx) / max(1, len(part.road_idx))
    return {"eval_seconds": scores, "road_seconds": road}


def calibrate(config: Mapping[str, Any], job: Job, eps: float) -> Calibration:
    """σ of the run's `Client`s (partition by the cell's shift, the server's schedule), each
    calibrating itself (`Method.calibrate`) and checked by the RDP accountant (XCal-FL: its
    gradient and signal budgets separately, and its proven bound against ε)."""
    wc, params = job.wc, job.params
    dataset = wc["dataset"]
    synthetic = config["data"][dataset]["synthetic"]
    n = int(synthetic["counts"][0])
    labels = medmnist_labels(dataset, n, seed=0, balance=synthetic.get("class_balance", "official"))
    images = np.zeros((n, 1, 1, 1), dtype=np.uint8)  # counts only
    context = job_context(job)
    parts = partition(images, labels, wc["shift"], int(wc["clients"]), params,
                      xcal_fed.partition_seed(wc))  # fmt: skip
    schedule = xcal_fed.client_schedule(context)
    method = resolve(wc["method"], True, params["presets"])
    sigmas, spent, ok = [], 0.0, True
    for k, (_, y) in enumerate(parts):
        rounds = sum(k in sampled for sampled in schedule)
        if rounds == 0:
            continue
        client = ClientAccount.plan(k, len(y), method, params, eps, planned_rounds=rounds)
        state = client.state
        history = [(state.sigma_ref, client.q, client.total_steps)]
        if isinstance(state, XCalState):  # XCal-FL: gradient and signal budgets, proven bound
            grad = accounting.epsilon(history, state.delta_grad)
            signal_history = [(state.sigma_signal, client.q, client.total_steps)]
            signal = accounting.epsilon(signal_history, state.delta_signal)
            client_eps = method.filter_epsilon(client)
            ok &= grad <= state.eps_grad * (1 + RTOL) and signal <= state.eps_signal * (1 + RTOL)
        else:
            client_eps = accounting.epsilon(history, client.delta)
        ok &= client_eps <= eps * (1 + RTOL)
        sigmas.append(state.sigma_ref)
        spent = max(spent, client_eps)
    note = f"{len(sigmas)} clients, σ_ref per client"
    return Calibration(eps, min(sigmas), max(sigmas), spent, bool(ok), note)


PROBE = StudyProbe(
    parts=(
        ProbePart("evaluation", "xcal_evaluation", shared=True),
        ProbePart("steps", "xcal"),
    ),
    probes={"xcal": probe_steps, "xcal_evaluation": probe_evaluation},
    calibrate=calibrate,
    data_name=lambda wildcards: wildcards["dataset"],
    write_data=write_medmnist,
)
