"""The XCal-FL ClientApp: dpmed's xcal `Client` on one SuperNode.

A SuperNode is one client site. Its `--node-config` says which client it is and where its data
live (`NodeSettings`); the round's plan (`dpmed.xcal.flower.wire`) says which job it trains.
Flower starts a fresh ClientApp process for every message, so each message rebuilds the client
from its data and the plan (deterministic: partition, calibration) and restores its state
(generators, the method's ledgers and Rényi filter, counters: `Client.state`) from the node's
`Context.state`, which stays on the SuperNode; it stores the new state back after training.

The client enforces its own budget: it trains only in rounds the public schedule samples it in
(the rounds it was calibrated for), once each, whatever the server asks.
"""

from __future__ import annotations

import io
import json
import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from dpmed.config.wildcards import parse_eps
from dpmed.privacy.dpsgd import wrap_per_sample
from dpmed.privacy.mechanisms import NOISE_OS_ENTROPY, NOISE_SEEDED
from dpmed.runtime import JobContext
from dpmed.xcal.client import Client, ClientSeeds
from dpmed.xcal.flower import wire
from dpmed.xcal.methods import resolve
from dpmed.xcal.run import (
    build_client,
    client_partitions,
    client_schedule,
    client_seeds,
    initial_network,
    load_split,
)

STATE_KEY = "xcal-client"
SPLITS = ("dpmed", "local")
SEED_SOURCES = ("job", "secret")

app = ClientApp()


@dataclass(frozen=True)
class NodeSettings:
    """A SuperNode's `--node-config`.

    Args:
        client: `partition-id`, the client's number in the federation (0 … K−1).
        data_dir: `data-dir`, the site's processed MedMNIST folder (train.npz, meta.json).
        split: `split`: "local" (default): the whole train split of `data_dir` is the site's
            data; "dpmed": deal `data_dir`'s train split to the K clients by the job's shift
            as the in-process run does and take part `client` (reproducing a simulation).
        seeds: `seeds`: "secret" (default): the client's sampling and noise generators are
            seeded from the node's OS entropy, known to nobody else; "job": dpmed's seeds
            derived from the job seed (`dpmed.xcal.run.client_seeds`), which the server knows
            too: for reproducing a simulation only.
        device: `device`, torch device name (default cpu).
        threads: `threads`, torch CPU threads (default 1).
    """

    client: int
    data_dir: Path
    split: str = "local"
    seeds: str = "secret"
    device: str = "cpu"
    threads: int = 1

    @classmethod
    def from_node_config(cls, config: dict[str, Any]) -> NodeSettings:
        if "partition-id" not in config or "data-dir" not in config:
            raise ValueError("the SuperNode's --node-config needs partition-id and data-dir")
        settings = cls(
            client=int(config["partition-id"]),
            data_dir=Path(str(config["data-dir"])),
            split=str(config.get("split", "local")),
            seeds=str(config.get("seeds", "secret")),
            device=str(config.get("device", "cpu")),
            threads=int(config.get("threads", 1)),
        )
        if settings.split not in SPLITS or settings.seeds not in SEED_SOURCES:
            raise ValueError(
                f"node-config split must be one of {SPLITS}, seeds one of {SEED_SOURCES}"
            )
        return settings

    @property
    def noise_source(self) -> str:
        """privacy.json's `noise_source` of this client's noise."""
        return NOISE_SEEDED if self.seeds == "job" else NOISE_OS_ENTROPY


def secret_seeds() -> ClientSeeds:
    """Seeds from the OS's entropy pool (drawn on the node, never sent)."""
    return ClientSeeds(*(secrets.randbits(63) for _ in range(3)))


def client_data(job: JobContext, settings: NodeSettings) -> tuple[np.ndarray, np.ndarray]:
    """The site's training images (uint8 N, H, W, C) and labels (`NodeSettings.split`)."""
    n_clients = int(job.wildcards["clients"])
    if not 0 <= settings.client < n_clients:
        raise ValueError(f"partition-id {settings.client} outside the job's {n_clients} clients")
    if settings.split == "local":
        return load_split(settings.data_dir, "train")
    return client_partitions(job)[settings.client]


@dataclass
class LocalClient:
    """The client with the network it trains and its per-sample wrapper (None: non-private)."""

    client: Client
    net: nn.Module
    wrapped: nn.Module | None
    schedule: list[list[int]]


def local_client(
    job: JobContext, arguments: dict[str, Any], settings: NodeSettings, state: RecordDict
) -> LocalClient:
    """Build the client of `job` on this node and restore its state from `state`."""
    device = job.start()
    wc = job.wildcards
    method = resolve(wc["method"], math.isfinite(parse_eps(wc["eps"])), job.params["presets"])
    schedule = client_schedule(job)
    net, layer = initial_network(wc, arguments, device)
    wrapped = wrap_per_sample(net, net.grad_sample_mode) if method.dp else None
    images, labels = client_data(job, settings)
    k = settings.client
    seeds = client_seeds(job, k) if settings.seeds == "job" else secret_seeds()
    client = build_client(job, k, images, labels, method, layer, schedule, device, seeds)
    saved = state.config_records.get(STATE_KEY)
    if saved is not None:  # a weights-only load: tensors, dicts, lists and numbers
        client.load_state(torch.load(io.BytesIO(bytes(saved["client"])), weights_only=True))
    return LocalClient(client, net, wrapped, schedule)


def trained_rounds(state: RecordDict) -> list[int]:
    """The 0-based rounds this node's client trained in so far."""
    saved = state.config_records.get(STATE_KEY)
    return [] if saved is None else json.loads(str(saved["trained"]))


def store(state: RecordDict, client: Client, trained: list[int]) -> None:
    """Keep the client's state and trained rounds in the node's Context.state."""
    buffer = io.BytesIO()
    torch.save(client.state(), buffer)
    state[STATE_KEY] = ConfigRecord({"client": buffer.getvalue(), "trained": json.dumps(trained)})


@app.query()
def hello(msg: Message, context: Context) -> Message:
    """The server's roll call: this node's client number, sample count and noise source."""
    settings = NodeSettings.from_node_config(dict(context.node_config))
    job, _, _ = wire.read_plan(msg.content, settings.data_dir, settings.device, settings.threads)
    _, labels = client_data(job, settings)
    report = {
        "client": settings.client,
        "n_samples": int(len(labels)),
        "noise_source": settings.noise_source,
    }
    return Message(
        RecordDict({wire.REPORT: ConfigRecord({"json": json.dumps(report)})}), reply_to=msg
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training from the global model in `msg`; replies with the update
    and the report (`dpmed.xcal.flower.wire`)."""
    settings = NodeSettings.from_node_config(dict(context.node_config))
    job, arguments, r = wire.read_plan(
        msg.content, settings.data_dir, settings.device, settings.threads
    )
    local = local_client(job, arguments, settings, context.state)
    trained = trained_rounds(context.state)
    if settings.client not in local.schedule[r] or r in trained:
        raise ValueError(
            f"client {settings.client} refuses round {r + 1}: not one of its scheduled rounds "
            "or already trained (its budget was calibrated to the schedule)"
        )
    device = local.client.x.device
    global_state = wire.record_tensors(msg.content.array_records[wire.GLOBAL], device)
    update = local.client.train_round(local.net, local.wrapped, global_state)
    store(context.state, local.client, [*trained, r])
    content = RecordDict(
        {
            wire.UPDATE: wire.tensors_record(update.tensors),
            wire.REPORT: wire.report_record(local.client, update, settings.noise_source),
        }
    )
    return Message(content, reply_to=msg)
