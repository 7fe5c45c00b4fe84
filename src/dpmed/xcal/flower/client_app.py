"""The XCal-FL ClientApp: dpmed's xcal `Client` on one SuperNode.

A SuperNode is one client site, set up by its `--node-config` (`NodeSettings`; in Flower's
simulation engine by the run config, `NodeSettings.simulated`); the round's plan
(`dpmed.xcal.flower.wire`) says which job the server asks it to train.

The node trusts its site, not the server. It refuses (the roll call and every round) a plan
that its site's `SitePolicy` (method, ε, δ, clip norm, most rounds, schedule seed) does not
admit, or that differs from the plan its `NodeLedger` is bound to; it trains only in rounds the
admitted plan's public schedule samples it in (the rounds it was calibrated for), once each.
Flower starts a fresh ClientApp process for every message, so each round rebuilds the client
from its data and the plan (deterministic: partition, calibration), restores its state
(generators, the method's ledgers and Rényi filter, counters: `Client.state`) from the ledger
file in the node's state folder, which outlives Flower runs and never leaves the node, and
saves the new state there before it replies (a computed update counts as spent). So no
request (another method, ε, δ, seed, round count or run id) makes it spend beyond its target.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from dpmed.config.wildcards import parse_eps
from dpmed.privacy.dpsgd import wrap_per_sample
from dpmed.privacy.mechanisms import NOISE_OS_ENTROPY, NOISE_SEEDED
from dpmed.runtime import JobContext
from dpmed.xcal.client import SECRET_SEEDS, Client
from dpmed.xcal.federation import (
    build_client,
    client_partitions,
    client_schedule,
    client_seeds,
    initial_network,
    load_split,
)
from dpmed.xcal.flower import wire
from dpmed.xcal.flower.policy import (
    NodeLedger,
    PlanRefused,
    SitePolicy,
    federation_plan,
    locked,
)
from dpmed.xcal.flower.runconfig import UserValue, job_from_run_config, processed_dir
from dpmed.xcal.methods import resolve

SPLITS = ("dpmed", "local")
SEED_SOURCES = ("job", "secret")
SIMULATION_KEYS = {"partition-id", "num-partitions"}  # a simulated node's whole node config

app = ClientApp()


@dataclass(frozen=True)
class NodeSettings:
    """A SuperNode's `--node-config`.

    Args:
        client: `partition-id`, the client's number in the federation (0 … K−1).
        data_dir: `data-dir`, the site's processed MedMNIST folder (train.npz, meta.json).
        policy: `policy`, the site's policy JSON file (`SitePolicy`), required.
        state_dir: `state-dir`, the node's folder for its ledger (`NodeLedger`), which
            outlives Flower runs, required.
        split: `split`: "local" (default): the whole train split of `data_dir` is the site's
            data; "dpmed": deal `data_dir`'s train split to the K clients by the job's shift
            as the in-process run does and take part `client` (reproducing a simulation).
        seeds: `seeds`: "secret" (default): the client's generators (samples, noise,
            control) take their whole state from the node's OS entropy, known to nobody
            else; "job": dpmed's seeds derived from the job seed
            (`dpmed.xcal.federation.client_seeds`), which the server knows too: for reproducing a
            simulation only.
        device: `device`, torch device name (default cpu).
        threads: `threads`, torch CPU threads (default 1).
    """

    client: int
    data_dir: Path
    policy: Path
    state_dir: Path
    split: str = "local"
    seeds: str = "secret"
    device: str = "cpu"
    threads: int = 1

    @classmethod
    def from_node_config(cls, config: dict[str, Any]) -> NodeSettings:
        required = ("partition-id", "data-dir", "policy", "state-dir")
        if missing := [key for key in required if key not in config]:
            raise ValueError(
                f"the SuperNode's --node-config lacks {', '.join(missing)}: it needs "
                "partition-id, data-dir, policy (the site's policy file) and state-dir"
            )
        return cls(
            client=int(config["partition-id"]),
            data_dir=Path(str(config["data-dir"])),
            policy=Path(str(config["policy"])),
            state_dir=Path(str(config["state-dir"])),
            split=str(config.get("split", "local")),
            seeds=str(config.get("seeds", "secret")),
            device=str(config.get("device", "cpu")),
            threads=int(config.get("threads", 1)),
        )

    @classmethod
    def simulated(cls, client: int, run_config: dict[str, UserValue], run_id: int) -> NodeSettings:
        """Client `client`'s settings in a simulation: the run config's data dealt as the
        in-process run deals them, its `simulation-seeds`, and the policy admitting exactly the
        run config's job, written with the client's ledger in
        <out>/flower-simulation/run-<run_id>/site-<client>/."""
        site = (
            Path(str(run_config["out"])) / "flower-simulation" / f"run-{run_id}" / f"site-{client}"
        )
        if not (site / "policy.json").exists():
            SitePolicy.for_job(job_from_run_config(run_config)).write(site / "policy.json")
        seeds = str(run_config["simulation-seeds"])
        return cls(
            client, processed_dir(run_config), site / "policy.json", site / "state", "dpmed", seeds
        )

    def __post_init__(self) -> None:
        if self.split not in SPLITS or self.seeds not in SEED_SOURCES:
            raise ValueError(f"split must be one of {SPLITS}, seeds one of {SEED_SOURCES}")

    @property
    def noise_source(self) -> str:
        """privacy.json's `noise_source` of this client's noise."""
        return NOISE_SEEDED if self.seeds == "job" else NOISE_OS_ENTROPY

    @property
    def ledger(self) -> Path:
        """The node's ledger file in its state folder."""
        return self.state_dir / f"xcal-client-{self.client}.pt"


def simulation() -> bool:
    """Whether this ClientApp runs in Flower's simulation engine (a Ray worker of the `flwr run`
    process) rather than on a SuperNode (a flwr-clientapp process, which never starts Ray)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def node_settings(context: Context) -> NodeSettings:
    """The node's settings: its --node-config on a SuperNode; in a simulation (whose node
    config is only partition-id and num-partitions) `NodeSettings.simulated`. A SuperNode never
    takes them from the run config, which the server sets."""
    config = dict(context.node_config)
    if simulation() and set(config) <= SIMULATION_KEYS:
        run_config = dict(context.run_config)
        return NodeSettings.simulated(int(config["partition-id"]), run_config, context.run_id)
    return NodeSettings.from_node_config(config)


def client_data(job: JobContext, settings: NodeSettings) -> tuple[np.ndarray, np.ndarray]:
    """The site's training images (uint8 N, H, W, C) and labels (`NodeSettings.split`)."""
    n_clients = int(job.wildcards["clients"])
    if not 0 <= settings.client < n_clients:
        raise ValueError(f"partition-id {settings.client} outside the job's {n_clients} clients")
    if settings.split == "local":
        return load_split(settings.data_dir, "train")
    return client_partitions(job)[settings.client]


def local_client(
    job: JobContext,
    arguments: dict[str, Any],
    settings: NodeSettings,
    schedule: list[list[int]],
    saved: dict | None,
) -> tuple[Client, nn.Module, nn.Module | None]:
    """The client of `job` on this node, calibrated to `schedule`, in the state `saved`
    (`Client.state`; None: a new client), the network it trains and its per-sample wrapper
    (None: non-private)."""
    device = job.start()
    wc = job.wildcards
    method = resolve(wc["method"], math.isfinite(parse_eps(wc["eps"])), job.params["presets"])
    net, layer = initial_network(wc, arguments, device)
    wrapped = wrap_per_sample(net, net.grad_sample_mode) if method.dp else None
    images, labels = client_data(job, settings)
    k = settings.client
    seeds = client_seeds(job, k) if settings.seeds == "job" else SECRET_SEEDS
    client = build_client(job, k, images, labels, method, layer, schedule, device, seeds)
    if saved is not None:
        client.load_state(saved)
    return client, net, wrapped


def admitted(settings: NodeSettings, job: JobContext, arguments: dict[str, Any]) -> NodeLedger:
    """The node's ledger for the plan of `job` if the site's policy and the ledger admit it;
    raises PlanRefused naming the client and why otherwise."""
    plan = json.dumps(federation_plan(job, arguments), sort_keys=True)
    ledger = NodeLedger.load(settings.ledger, plan)
    reason = SitePolicy.read(settings.policy).refusal(job) or ledger.refusal(plan)
    if reason is not None:
        raise PlanRefused(f"client {settings.client} refuses the plan: {reason}")
    return ledger


def round_refusal(k: int, r: int, schedule: list[list[int]], trained: list[int]) -> str | None:
    """Why client k refuses to train in 0-based round r of `schedule`, None if it may."""
    if not 0 <= r < len(schedule):
        return f"the plan has rounds 1 … {len(schedule)}"
    if k not in schedule[r]:
        return "the schedule does not sample it in this round (its budget is calibrated to it)"
    if r in trained:
        return "it already trained in this round (its ledger counts it as spent)"
    return None


@app.query()
def hello(msg: Message, context: Context) -> Message:
    """The server's roll call: this node's client number, sample count and noise source, if
    the node admits the plan (a refusal fails the run at its start)."""
    settings = node_settings(context)
    job, arguments, _ = wire.read_plan(
        msg.content, settings.data_dir, settings.device, settings.threads
    )
    admitted(settings, job, arguments)
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
    settings = node_settings(context)
    job, arguments, r = wire.read_plan(
        msg.content, settings.data_dir, settings.device, settings.threads
    )
    k = settings.client
    with locked(settings.ledger):
        ledger = admitted(settings, job, arguments)
        schedule = client_schedule(job)  # of the admitted plan: at most max_rounds rounds
        if reason := round_refusal(k, r, schedule, ledger.trained):
            raise PlanRefused(f"client {k} refuses round {r + 1}: {reason}")
        client, net, wrapped = local_client(job, arguments, settings, schedule, ledger.client)
        global_state = wire.record_tensors(msg.content.array_records[wire.GLOBAL], client.x.device)
        update = client.train_round(net, wrapped, global_state)
        ledger.trained.append(r)
        ledger.client = client.state()
        ledger.save()
    content = RecordDict(
        {
            wire.UPDATE: ArrayRecord.from_torch_state_dict(update.tensors),
            wire.REPORT: wire.report_record(client, update, settings.noise_source),
        }
    )
    return Message(content, reply_to=msg)
