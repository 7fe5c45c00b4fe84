"""XCal-FL study runner (paper 001): in-process FedAvg over clients of one MedMNIST dataset.

One run = one cell of the xcal grid (`dpmed.xcal.spec`). The training split is dealt to the
clients by the cell's shift (`dpmed.xcal.shifts`); the clients train locally under the cell's
method (`dpmed.xcal.methods`) and send only model tensors and their ledger. Each round the
server samples m of the K clients (paper 001 App. A; `clients_per_round`, all K when m ≥ K),
averages their tensors weighted by client sample count (FedAvg) and evaluates the global model
on the test split after every round (macro F1, accuracy; ROAD every `road_every` rounds and
after the last, on a fixed test subsample shared by every run of the dataset).

Outputs in the run folder: rounds.csv (round, f1, accuracy, epsilon = max over clients of the
proven ε bound so far, eps_spent = max over clients of the ε spent so far, the same accounting
for every method (`Method.realised_epsilon`), road = the paper's ROAD in %, road_combined,
seconds), metrics.json,
privacy.json, road.json, gradcam.npz (Grad-CAM examples of the final model), model.pt (the
final global model) and config.json (`dpmed.runtime.run_config`). A fingerprinted checkpoint
after every round lets a killed run resume; it is removed once the outputs exist.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from dpmed.checkpoint import Checkpoint
from dpmed.config.grid import common_seed
from dpmed.config.wildcards import parse_eps
from dpmed.data.npz import read_npz
from dpmed.io import write_csv, write_json, write_npz
from dpmed.models import build_model, save_model
from dpmed.models.classifiers import gradcam_layer
from dpmed.privacy.dpsgd import wrap_per_sample
from dpmed.runtime import JobContext, Progress
from dpmed.seeding import stable_seed
from dpmed.tracking import tracker
from dpmed.xcal import evaluate as xcal_eval
from dpmed.xcal.averaging import weighted_mean
from dpmed.xcal.client import Client, ClientSeeds, ClientUpdate
from dpmed.xcal.methods import Method, resolve
from dpmed.xcal.privacy import privacy_record
from dpmed.xcal.shifts import partition
from dpmed.xcal.timing import forward_pair_seconds

N_GRADCAM_EXAMPLES = 4
ROUND_COLUMNS = [
    "round",
    "f1",
    "accuracy",
    "epsilon",
    "eps_spent",
    "road",
    "road_combined",
    "seconds",
]


@dataclass
class Federation:
    """What a run trains and evaluates.

    Args:
        net: the global network.
        wrapped: its per-sample-gradient wrapper (None for non-private methods).
        clients: the clients, in partition order.
        evaluation: the test set, ROAD subsample and Grad-CAM layer.
        method: the method the clients train with.
        model_arguments: the network's build arguments (saved with it in model.pt).
        schedule: the clients the server samples, per round (`client_schedule`).
    """

    net: nn.Module
    wrapped: nn.Module | None
    clients: list[Client]
    evaluation: xcal_eval.Evaluation
    method: Method
    model_arguments: dict[str, Any]
    schedule: list[list[int]]


@dataclass
class History:
    """The resumable part of a run: the global weights, one row per finished round, the time
    spent in rounds and the last round's ROAD (None unless ROAD ran in it)."""

    global_state: dict[str, torch.Tensor]
    rows: list[dict] = field(default_factory=list)
    elapsed: float = 0.0
    last_road: dict | None = None

    @property
    def rounds_done(self) -> int:
        return len(self.rows)


def run(job: JobContext) -> dict:
    """Train one grid cell and write its outputs (module docstring); returns metrics.json."""
    prepared = prepare(job)
    device, fed = prepared.device, prepared.federation
    job.write_config("xcal", device)
    checkpoint = job.checkpoint("xcal")
    history = resume(checkpoint, fed, device)
    rounds = job.params["rounds"]
    progress = Progress(run_label(job.wildcards), rounds, start=history.rounds_done)
    with tracker(job.out_dir, job.tensorboard, "round", history.rounds_done) as board:
        for r in range(history.rounds_done, rounds):
            road_due = (r + 1) % job.params["road_every"] == 0 or r + 1 == rounds
            scores = train_round(fed, history, road_due)
            checkpoint.save(checkpoint_state(fed, history))
            progress.line(r + 1, scores, history.rows[-1]["epsilon"])
            board.log(history.rows[-1])
    metrics = write_outputs(job, fed, history)
    checkpoint.remove()
    return metrics


@dataclass(frozen=True)
class XcalSetup:
    """What an xcal job trains with before its first round (`prepare`): its device and its
    federation (clients calibrated to their planned rounds)."""

    device: torch.device
    federation: Federation


def prepare(job: JobContext, parts: list[tuple[np.ndarray, np.ndarray]] | None = None) -> XcalSetup:
    """Start `job` (seeds, device) and build its federation, drawing every seed in the order
    a run does: the runner, the privacy audit (`dpmed.xcal.audit`) and the preflight probes
    (`dpmed.xcal.probe`) all start here. `parts` replaces the clients' data (an audit adds its
    input canaries to `client_partitions(job)`)."""
    device = job.start()
    return XcalSetup(device, build_federation(job, device, parts))


def run_label(wildcards: dict[str, str]) -> str:
    """The progress-line label: `xcal dataset/model/method/shift`."""
    return "xcal " + "/".join(wildcards[k] for k in ("dataset", "model", "method", "shift"))


# ---------------------------------------------------------------------------------- build


def load_split(processed_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 (N, H, W, C) and labels int64 (N,) of one processed MedMNIST split (a
    corrupt file is a DataFormatError naming it)."""
    arrays = read_npz(Path(processed_dir) / f"{split}.npz", ("images", "labels"))
    return arrays["images"], arrays["labels"]


def to_tensor(images: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 (N, H, W, C) → float32 (N, C, H, W) in [0, 1] on `device`."""
    x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    return (x.to(torch.float32) / 255.0).to(device)


def build_federation(
    job: JobContext,
    device: torch.device,
    parts: list[tuple[np.ndarray, np.ndarray]] | None = None,
) -> Federation:
    """Partition, initial network, clients and test evaluation of the job's cell; `parts`
    replaces `client_partitions(job)` (a privacy audit adds its input canaries to it)."""
    wc, params = job.wildcards, job.params
    meta = json.loads((Path(job.processed_dir) / "meta.json").read_text())
    eps = parse_eps(wc["eps"])
    method = resolve(wc["method"], math.isfinite(eps), params["presets"])
    parts = client_partitions(job) if parts is None else parts
    schedule = client_schedule(job)
    arguments = {
        "in_channels": int(meta["channels"]),
        "n_classes": int(meta["n_classes"]),
        "image_size": int(meta["size"]),
        "width_scale": params["width_scale"],
    }
    net, layer = initial_network(wc, arguments, device)
    wrapped = wrap_per_sample(net, net.grad_sample_mode) if method.dp else None
    clients = [
        build_client(job, k, images, labels, method, layer, schedule, device)
        for k, (images, labels) in enumerate(parts)
    ]
    evaluated = wrapped if wrapped is not None else net
    evaluation = build_evaluation(job, evaluated, layer, arguments["n_classes"], device)
    return Federation(net, wrapped, clients, evaluation, method, arguments, schedule)


def build_client(
    job: JobContext,
    k: int,
    images: np.ndarray,
    labels: np.ndarray,
    method: Method,
    layer: str,
    schedule: list[list[int]],
    device: torch.device,
    seeds: ClientSeeds | None = None,
) -> Client:
    """Client k of the job on `images` (uint8 N, H, W, C) and `labels`, calibrated to the
    rounds `schedule` samples it in; `seeds` replaces `client_seeds(job, k)` (a deployed client
    draws its own, `dpmed.xcal.flower`)."""
    return Client(
        k,
        to_tensor(images, device),
        torch.from_numpy(labels).to(device),
        method,
        job.params,
        parse_eps(job.wildcards["eps"]),
        client_seeds(job, k) if seeds is None else seeds,
        layer,
        planned_rounds=sum(k in sampled for sampled in schedule),
    )


def client_seeds(job: JobContext, k: int) -> ClientSeeds:
    """Client k's seeds: its gradient and signal samples from the seed block
    (`common_seed`: every method and ε of a (dataset, model, shift, clients, seed) block sees
    the same batches), its noise from the job seed (independent per mechanism), the random-σ_t
    control's draws from the seed block too (they are sent to the server anyway)."""
    wc = job.wildcards
    return ClientSeeds(
        sampling=common_seed("xcal", wc, f"client-sampling-{k}"),
        signal=common_seed("xcal", wc, f"client-signal-sampling-{k}"),
        noise=stable_seed(job.seed, "client-noise", k),
        control=common_seed("xcal", wc, f"client-control-{k}"),
    )


def client_partitions(job: JobContext) -> list[tuple[np.ndarray, np.ndarray]]:
    """The training split dealt to the clients by the cell's shift. Every method of a
    (dataset, shift, clients, seed) cell sees the same partition (paired comparisons)."""
    wc = job.wildcards
    images, labels = load_split(job.processed_dir, "train")
    seed = stable_seed("xcal-partition", *(wc[k] for k in ("dataset", "shift", "clients", "seed")))
    return partition(images, labels, wc["shift"], int(wc["clients"]), job.params, seed)


def sampled_clients(n_clients: int, per_round: int, seed: int) -> list[int]:
    """One round's clients: min(m, K) of the K uniformly without replacement, in index order."""
    rng = np.random.default_rng(seed)
    return sorted(int(k) for k in rng.choice(n_clients, min(per_round, n_clients), replace=False))


def client_schedule(job: JobContext) -> list[list[int]]:
    """The clients the server samples in every round, each round seeded by the cell and the
    round: every method of a (dataset, shift, clients, seed) cell sees the same schedule
    (paired comparisons). Drawn from seeds alone, it is independent of the data, so each client
    is calibrated to exactly the rounds it will train (`Client`) at no privacy cost."""
    wc = job.wildcards
    cell = [wc[k] for k in ("dataset", "shift", "clients", "seed")]
    return [
        sampled_clients(
            int(wc["clients"]),
            job.params["clients_per_round"],
            stable_seed("xcal-clients", *cell, r),
        )
        for r in range(job.params["rounds"])
    ]


def initial_network(
    wc: dict[str, str], arguments: dict[str, Any], device: torch.device
) -> tuple[nn.Module, str]:
    """The initial network (the same for every method of a (dataset, model, seed) cell; the
    job seed drives only the noise) and its Grad-CAM layer."""
    torch.manual_seed(stable_seed("xcal-init", wc["dataset"], wc["model"], wc["seed"]))
    net = build_model(wc["model"], **arguments).to(device)
    return net, gradcam_layer(net, arguments["in_channels"], arguments["image_size"])


def build_evaluation(
    job: JobContext, module: nn.Module, layer: str, n_classes: int, device: torch.device
) -> xcal_eval.Evaluation:
    """The test split, the dataset's fixed ROAD subsample and its imputation seed."""
    images, labels = load_split(job.processed_dir, "test")
    dataset = job.wildcards["dataset"]
    return xcal_eval.Evaluation(
        module,
        layer,
        to_tensor(images, device),
        torch.from_numpy(labels).to(device),
        n_classes,
        road_subsample(len(labels), job.params["road_subsample"], dataset),
        list(job.params["road_percentages"]),
        stable_seed("xcal-road-noise", dataset),
    )


def road_subsample(n_test: int, size: int, dataset: str) -> np.ndarray:
    """Fixed test indices for ROAD: the first `size` of a permutation seeded by the dataset."""
    rng = np.random.default_rng(stable_seed("xcal-road-subsample", dataset))
    return np.sort(rng.permutation(n_test)[: min(size, n_test)])


# ---------------------------------------------------------------------------------- resume


def resume(checkpoint: Checkpoint, fed: Federation, device: torch.device) -> History:
    """The job's checkpointed history with the global weights, clients and global RNGs
    restored, or a fresh one (no checkpoint, or one of another configuration)."""
    initial = {k: v.detach().clone() for k, v in fed.net.state_dict().items()}
    state = checkpoint.load()
    if state is None:
        return History(initial)
    global_state = {k: v.to(device) for k, v in state["global"].items()}
    fed.net.load_state_dict(global_state)  # a run stopped after its last round evaluates these
    for client, client_state in zip(fed.clients, state["clients"], strict=True):
        client.load_state(client_state)
    history = History(global_state, state["rows"], state["elapsed"], state["last_road"])
    print(f"resuming {checkpoint.path.parent} after round {history.rounds_done}", flush=True)
    return history


def checkpoint_state(fed: Federation, history: History) -> dict[str, Any]:
    """What `resume` needs after a round (the fingerprint and RNGs are `Checkpoint.save`'s)."""
    return {
        "global": history.global_state,
        "rows": history.rows,
        "elapsed": history.elapsed,
        "last_road": history.last_road,
        "clients": [c.state() for c in fed.clients],
    }


# ---------------------------------------------------------------------------------- rounds


def fedavg(updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
    """Σ_k n_k w_k / Σ_k n_k for every tensor (FedAvg weighted by client sample count)."""
    weights = [u.n_samples for u in updates]
    return {
        key: weighted_mean([u.tensors[key] for u in updates], weights) for key in updates[0].tensors
    }


def train_round(
    fed: Federation,
    history: History,
    road_due: bool,
    remote: Callable[[list[Client], dict], list[ClientUpdate]] | None = None,
) -> dict[str, float]:
    """One round: local training of the sampled clients, FedAvg of their updates, evaluation;
    appends the round's row to `history` and returns the scores for the progress line. The
    row's ε (proven bound) and spent ε are the maxima over all clients of each one's so far (a
    client not sampled this round spent nothing in it). `remote(sampled, global_state)`, when
    given, trains the sampled clients elsewhere (a deployed federation, `dpmed.xcal.flower`)
    and returns the updates that arrived, in client order."""
    t0 = time.perf_counter()
    sampled = [fed.clients[k] for k in fed.schedule[history.rounds_done]]
    if remote is None:
        updates = [c.train_round(fed.net, fed.wrapped, history.global_state) for c in sampled]
    else:
        updates = remote(sampled, history.global_state)
    history.global_state = fedavg(updates)
    fed.net.load_state_dict(history.global_state)
    scores = fed.evaluation.scores()
    cumulative = max(float(c.epsilon()) for c in fed.clients) if fed.method.dp else None
    spent = max(float(c.realised_epsilon()) for c in fed.clients) if fed.method.dp else None
    history.last_road = fed.evaluation.road() if road_due else None
    history.elapsed += time.perf_counter() - t0
    history.rows.append(
        {
            "round": history.rounds_done + 1,
            "f1": scores["f1"],
            "accuracy": scores["accuracy"],
            "epsilon": cumulative,
            "eps_spent": spent,
            "road": history.last_road["road"] if road_due else None,
            "road_combined": history.last_road["combined"] if road_due else None,
            "seconds": history.elapsed,
        }
    )
    return {"f1": scores["f1"], "acc": scores["accuracy"]}


# ---------------------------------------------------------------------------------- outputs


def write_outputs(job: JobContext, fed: Federation, history: History) -> dict:
    """Write rounds.csv, road.json, gradcam.npz, privacy.json, model.pt and metrics.json."""
    out_dir = Path(job.out_dir)
    write_csv(out_dir / "rounds.csv", pd.DataFrame(history.rows, columns=ROUND_COLUMNS))
    road = write_road(out_dir / "road.json", fed.evaluation, history)
    write_gradcam(out_dir / "gradcam.npz", fed.evaluation)
    eps = parse_eps(job.wildcards["eps"])
    record = privacy_record(fed.clients, fed.method, eps, job.params)
    record.write(out_dir / "privacy.json", job.wildcards["dataset"])
    save_model(out_dir / "model.pt", job.wildcards["model"], fed.model_arguments, fed.net)
    metrics = run_metrics(job.wildcards, fed, history.rows, road, record.epsilon)
    write_json(out_dir / "metrics.json", metrics)
    return metrics


def write_road(path: Path, evaluation: xcal_eval.Evaluation, history: History) -> dict:
    """road.json: the final model's ROAD (the last round's), its subsample size, layer, the
    ROAD trajectory over the rounds that had one, and under `random` the final model's ROAD
    of uniform random attributions (the baseline a saliency map must beat); the trajectory's
    rounds carry the proven `epsilon` and the spent `eps_spent`."""
    result = dict(history.last_road if history.last_road is not None else evaluation.road())
    baseline = evaluation.road_random()
    result["random"] = {k: baseline[k] for k in ("road", "morf_drop", "lerf_drop", "combined")}
    result["subsample"] = int(len(evaluation.road_idx))
    result["layer"] = evaluation.layer
    result["trajectory"] = [
        {k: row[k] for k in ("round", "epsilon", "eps_spent", "road")}
        for row in history.rows
        if row["road"] is not None
    ]
    write_json(path, result)
    return result


def write_gradcam(path: Path, evaluation: xcal_eval.Evaluation) -> None:
    """gradcam.npz: the first `N_GRADCAM_EXAMPLES` ROAD images, their Grad-CAM maps for the
    predicted class, labels and predictions."""
    examples = evaluation.road_idx[:N_GRADCAM_EXAMPLES]
    maps, pred = xcal_eval.attributions(evaluation.module, evaluation.layer, evaluation.x[examples])
    write_npz(
        path,
        images=evaluation.x[examples].cpu().numpy().astype(np.float32),
        cams=maps.astype(np.float32),
        labels=evaluation.y[examples].cpu().numpy(),
        predictions=pred,
    )


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
    XCal-FL's slope is not flattened by its whole-run bound), step counts and times, the time of
    two inference-mode forward passes (paper 001 §8's overhead measure, `dpmed.xcal.timing`),
    the σs and signals the clients used."""
    clients = fed.clients
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
            fed.wrapped if fed.wrapped is not None else fed.net, clients
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
