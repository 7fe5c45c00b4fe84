"""What an xcal job's in-process run (`dpmed.xcal.run`) and its Flower apps
(`dpmed.xcal.flower`) share: the federation of one grid cell (network, clients, test
evaluation), the server's m-of-K schedule, the clients' partitions and seeds, one round and its
FedAvg, and the outputs both write.

Every seed of the data path comes from the cell's seed block (`common_seed`: every method and
ε of a (dataset, model, shift, clients, seed) block sees the same partition, schedule, initial
network and batches; paired comparisons) except the clients' Gaussian noise, which is the job's
own, and the ROAD subsample, fixed per dataset.
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

from dpmed.config.grid import common_seed
from dpmed.config.wildcards import parse_eps
from dpmed.data.npz import read_npz
from dpmed.io import write_csv, write_json, write_npz
from dpmed.models import build_model, save_model
from dpmed.models.classifiers import gradcam_layer
from dpmed.privacy.dpsgd import wrap_per_sample
from dpmed.runtime import JobContext
from dpmed.seeding import stable_seed
from dpmed.xcal import evaluate as xcal_eval
from dpmed.xcal.account import ClientAccount
from dpmed.xcal.client import Client, ClientSeeds, ClientUpdate
from dpmed.xcal.methods import Method, resolve
from dpmed.xcal.shifts import partition

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
        clients: the clients, in partition order (none on the Flower server).
        accounts: every client's privacy account (`ClientAccount`; the clients' own, or the
            Flower server's from the plan).
        evaluation: the test set, ROAD subsample and Grad-CAM layer.
        method: the method the clients train with.
        model_arguments: the network's build arguments (saved with it in model.pt).
        schedule: the clients the server samples, per round (`client_schedule`).
    """

    net: nn.Module
    wrapped: nn.Module | None
    clients: list[Client]
    accounts: list[ClientAccount]
    evaluation: xcal_eval.Evaluation
    method: Method
    model_arguments: dict[str, Any]
    schedule: list[list[int]]


@dataclass
class TrainState:
    """The resumable part of a run: the global weights, one row per finished round, the time
    spent in rounds and the last round's ROAD (None unless ROAD ran in it)."""

    global_state: dict[str, torch.Tensor]
    rows: list[dict] = field(default_factory=list)
    elapsed: float = 0.0
    last_road: dict | None = None

    @property
    def rounds_done(self) -> int:
        return len(self.rows)

    @classmethod
    def start(cls, net: nn.Module) -> TrainState:
        """A run's state before its first round: `net`'s weights, no rows."""
        return cls({k: v.detach().clone() for k, v in net.state_dict().items()})


def prepare(
    job: JobContext, parts: list[tuple[np.ndarray, np.ndarray]] | None = None
) -> tuple[torch.device, Federation]:
    """Start `job` (seeds, device) and build its federation (clients calibrated to their
    planned rounds), drawing every seed in the order a run does: the runner, the privacy
    audit (`dpmed.xcal.audit`) and the preflight probes (`dpmed.xcal.probe`) all start here.
    `parts` replaces the clients' data (an audit adds its input canaries to
    `client_partitions(job)`)."""
    device = job.start()
    return device, build_federation(job, device, parts)


def run_label(wildcards: dict[str, str]) -> str:
    """The progress-line label: `xcal dataset/model/method/shift`."""
    return "xcal " + "/".join(wildcards[k] for k in ("dataset", "model", "method", "shift"))


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
    """Partition, initial network, clients and test evaluation of the job's cell (the test
    split; ROAD on the first `road_subsample` indices of a permutation seeded by the dataset,
    the same for every run of it, with the dataset's imputation seed); `parts`
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
    images, labels = load_split(job.processed_dir, "test")
    dataset, n_test = wc["dataset"], len(labels)
    road = np.random.default_rng(stable_seed("xcal-road-subsample", dataset)).permutation(n_test)
    evaluation = xcal_eval.Evaluation(
        wrapped if wrapped is not None else net,
        layer,
        to_tensor(images, device),
        torch.from_numpy(labels).to(device),
        arguments["n_classes"],
        np.sort(road[: min(params["road_subsample"], n_test)]),
        list(params["road_percentages"]),
        stable_seed("xcal-road-noise", dataset),
    )
    accounts = [c.account for c in clients]
    return Federation(net, wrapped, clients, accounts, evaluation, method, arguments, schedule)


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
    """The training split dealt to the clients by the cell's shift, the same for every run of
    the seed block (`partition_seed`)."""
    wc = job.wildcards
    images, labels = load_split(job.processed_dir, "train")
    return partition(
        images, labels, wc["shift"], int(wc["clients"]), job.params, partition_seed(wc)
    )


def partition_seed(wc: dict[str, str]) -> int:
    """The seed of the cell's partition (`client_partitions`): the seed block's, so every
    method and ε of a (dataset, model, shift, clients, seed) block sees the same partition."""
    return common_seed("xcal", wc, "partition")


def sampled_clients(n_clients: int, per_round: int, seed: int) -> list[int]:
    """One round's clients: min(m, K) of the K uniformly without replacement, in index order."""
    rng = np.random.default_rng(seed)
    return sorted(int(k) for k in rng.choice(n_clients, min(per_round, n_clients), replace=False))


def client_schedule(job: JobContext) -> list[list[int]]:
    """The clients the server samples in every round, each round seeded by the seed block and
    the round: every method and ε of a block sees the same schedule (paired comparisons).
    Drawn from seeds alone, it is independent of the data, so each client is calibrated to
    exactly the rounds it will train (`ClientAccount`) at no privacy cost."""
    wc = job.wildcards
    return [
        sampled_clients(
            int(wc["clients"]),
            job.params["clients_per_round"],
            common_seed("xcal", wc, f"schedule-{r}"),
        )
        for r in range(job.params["rounds"])
    ]


def initial_network(
    wc: dict[str, str], arguments: dict[str, Any], device: torch.device
) -> tuple[nn.Module, str]:
    """The initial network, drawn from the seed block's `init` seed without touching the
    global RNG (the same for every method and ε of the block; the job seed drives only the
    noise), and its Grad-CAM layer."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(common_seed("xcal", wc, "init"))
        net = build_model(wc["model"], **arguments).to(device)
    return net, gradcam_layer(net, arguments["in_channels"], arguments["image_size"])


def fedavg(updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
    """Σ_k α_k w_k, α_k = n_k / Σ_j n_j (FedAvg weighted by client sample count), per tensor
    in its own dtype: each float64 α_k is cast to it and the products are summed in client
    order, so the average does not depend on where it is computed."""
    counts = np.array([u.n_samples for u in updates], dtype=np.float64)
    alpha = [float(a) for a in counts / counts.sum()]
    averaged = {}
    for key in updates[0].tensors:
        total = updates[0].tensors[key] * alpha[0]
        for a, update in zip(alpha[1:], updates[1:], strict=True):
            total += update.tensors[key] * a
        averaged[key] = total
    return averaged


def train_round(
    fed: Federation,
    state: TrainState,
    road_due: bool,
    remote: Callable[[list[int], dict], list[ClientUpdate]] | None = None,
) -> dict[str, float]:
    """One round: local training of the sampled clients, FedAvg of their updates, evaluation;
    appends the round's row to `state` and returns the scores for the progress line. The
    row's ε (proven bound) and spent ε are the maxima over all clients of each one's so far (a
    client not sampled this round spent nothing in it). `remote(sampled, global_state)`, when
    given, trains the sampled clients (their indices) elsewhere (a deployed federation,
    `dpmed.xcal.flower`) and returns the updates that arrived, in client order."""
    t0 = time.perf_counter()
    sampled = fed.schedule[state.rounds_done]
    if remote is None:
        updates = [
            fed.clients[k].train_round(fed.net, fed.wrapped, state.global_state) for k in sampled
        ]
    else:
        updates = remote(sampled, state.global_state)
    state.global_state = fedavg(updates)
    fed.net.load_state_dict(state.global_state)
    scores = fed.evaluation.scores()
    cumulative = max(float(a.epsilon()) for a in fed.accounts) if fed.method.dp else None
    spent = max(float(a.realised_epsilon()) for a in fed.accounts) if fed.method.dp else None
    state.last_road = fed.evaluation.road() if road_due else None
    state.elapsed += time.perf_counter() - t0
    state.rows.append(
        {
            "round": state.rounds_done + 1,
            "f1": scores["f1"],
            "accuracy": scores["accuracy"],
            "epsilon": cumulative,
            "eps_spent": spent,
            "road": state.last_road["road"] if road_due else None,
            "road_combined": state.last_road["combined"] if road_due else None,
            "seconds": state.elapsed,
        }
    )
    return {"f1": scores["f1"], "acc": scores["accuracy"]}


def write_model_outputs(job: JobContext, fed: Federation, state: TrainState) -> dict:
    """rounds.csv, road.json (`write_road`), gradcam.npz (the first `N_GRADCAM_EXAMPLES` ROAD
    images, their Grad-CAM maps for the predicted class, labels and predictions) and model.pt,
    as every run writes them; road.json's content."""
    out_dir, evaluation = Path(job.out_dir), fed.evaluation
    write_csv(out_dir / "rounds.csv", pd.DataFrame(state.rows, columns=ROUND_COLUMNS))
    road = write_road(out_dir / "road.json", evaluation, state)
    examples = evaluation.road_idx[:N_GRADCAM_EXAMPLES]
    maps, pred = xcal_eval.attributions(evaluation.module, evaluation.layer, evaluation.x[examples])
    write_npz(
        out_dir / "gradcam.npz",
        images=evaluation.x[examples].cpu().numpy().astype(np.float32),
        cams=maps.astype(np.float32),
        labels=evaluation.y[examples].cpu().numpy(),
        predictions=pred,
    )
    save_model(out_dir / "model.pt", job.wildcards["model"], fed.model_arguments, fed.net)
    return road


def write_road(path: Path, evaluation: xcal_eval.Evaluation, state: TrainState) -> dict:
    """road.json: the final model's ROAD (the last round's), its subsample size, layer, the
    ROAD trajectory over the rounds that had one, and under `random` the final model's ROAD
    of uniform random attributions (the baseline a saliency map must beat); the trajectory's
    rounds carry the proven `epsilon` and the spent `eps_spent`."""
    result = dict(state.last_road if state.last_road is not None else evaluation.road())
    baseline = evaluation.road_random()
    result["random"] = {k: baseline[k] for k in ("road", "morf_drop", "lerf_drop", "combined")}
    result["subsample"] = int(len(evaluation.road_idx))
    result["layer"] = evaluation.layer
    result["trajectory"] = [
        {k: row[k] for k in ("round", "epsilon", "eps_spent", "road")}
        for row in state.rows
        if row["road"] is not None
    ]
    write_json(path, result)
    return result
