"""The XCal-FL ServerApp: dpmed's xcal server over Flower's Grid.

It runs the job its run config names (`job`, a `dpmed.xcal.flower.jobfile`) as
`dpmed.xcal.run.run` does, except that the sampled clients train on their SuperNodes: the same
federation without client data (`build_federation` with no partitions), the same m-of-K
schedule, `train_round` with a remote trainer (`RemoteRound`): sample-weighted FedAvg over the
updates that arrived, in client order, then the test evaluation. So with the same job, seeds,
partition and rounds the model equals the in-process run's.

The server holds a view of every client (`ledger_view`: a `Client` without data and without
the client's generators) that each report restores (`wire.restore_view`); it recomputes the
client's ε from that ledger, refuses a report whose ε differs from it, and writes privacy.json
from the views with dpmed's `privacy_record`. A sampled client whose update does not arrive
(its node is gone, its ClientApp failed, or `round-timeout` passed) is left out of the round's
average, spent nothing the server saw, and is named in privacy.json (`extra.failed_updates`)
and federation.json; a round with no update at all ends the run with an error.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from dpmed.config.wildcards import parse_eps
from dpmed.io import write_csv, write_json
from dpmed.models import save_model
from dpmed.privacy.record import PrivacyRecord
from dpmed.runtime import JobContext, Progress
from dpmed.xcal.client import Client, ClientSeeds, ClientUpdate
from dpmed.xcal.flower import PROGRESS_LABEL, wire
from dpmed.xcal.flower.jobfile import read_job
from dpmed.xcal.privacy import privacy_record
from dpmed.xcal.run import (
    ROUND_COLUMNS,
    Federation,
    History,
    build_client,
    build_federation,
    run_label,
    train_round,
    write_gradcam,
    write_road,
)

POLL_SECONDS = 0.2  # how often the server asks the SuperLink for replies
FAILED_REASON = (
    "a sampled client whose update did not arrive (extra.failed_updates) is left out of that "
    "round's average; its epsilon counts the rounds whose updates arrived (a client that "
    "trained before failing released nothing the server received)"
)

app = ServerApp()


class FederationError(RuntimeError):
    """The federation cannot run the job (clients missing, a round without any update, a
    report inconsistent with its ledger)."""


@dataclass(frozen=True)
class Node:
    """A client's SuperNode as the roll call found it."""

    node_id: int
    n_samples: int
    noise_source: str


@dataclass
class RoundLog:
    """federation.json's record of the rounds: sampled, received and failed clients."""

    rounds: list[dict[str, Any]] = field(default_factory=list)

    def failures(self) -> list[dict[str, Any]]:
        return [
            {"round": r["round"], "client": k, "reason": reason}
            for r in self.rounds
            for k, reason in sorted(r["failed"].items())
        ]


def ledger_view(job: JobContext, k: int, n: int, fed: Federation, device: torch.device) -> Client:
    """The server's view of client k with `n` samples: a `Client` with zero-size images, its
    method state calibrated as the client's own (the same q, planned rounds and target), whose
    generators are placeholders it never draws from."""
    images = np.zeros((n, 0, 0, 0), dtype=np.uint8)
    labels = np.zeros(n, dtype=np.int64)
    seeds = ClientSeeds(0, 0, 0)
    layer = fed.evaluation.layer
    return build_client(job, k, images, labels, fed.method, layer, fed.schedule, device, seeds)


def exchange(grid: Grid, messages: dict[int, Message], timeout: float) -> dict[int, Message]:
    """Push one message per client and pull the replies until all came or `timeout` s passed;
    the replies by client (errors included, missing ones absent)."""
    clients = list(messages)
    ids = list(grid.push_messages([messages[k] for k in clients]))
    waiting = {mid: k for mid, k in zip(ids, clients, strict=True) if mid}
    replies: dict[int, Message] = {}
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(waiting)):
            replies[waiting.pop(reply.metadata.reply_to_message_id)] = reply
        if waiting:
            time.sleep(POLL_SECONDS)
    return replies


def roll_call(grid: Grid, job: JobContext, arguments: dict, timeout: float) -> dict[int, Node]:
    """Wait for the job's K clients' SuperNodes and ask each which client it is; raises
    FederationError unless every client 0 … K−1 answers exactly once within `timeout` s."""
    n_clients = int(job.wildcards["clients"])
    deadline = time.monotonic() + timeout
    while len(node_ids := list(grid.get_node_ids())) < n_clients:
        if time.monotonic() > deadline:
            raise FederationError(f"{len(node_ids)} SuperNodes connected, the job has {n_clients}")
        time.sleep(POLL_SECONDS)
    plan = wire.plan_record(job, -1, arguments)
    messages = {
        i: Message(RecordDict({wire.PLAN: plan}), dst_node_id=node, message_type=MessageType.QUERY)
        for i, node in enumerate(node_ids)
    }
    replies = exchange(grid, messages, max(1.0, deadline - time.monotonic()))
    nodes: dict[int, Node] = {}
    for i, node in enumerate(node_ids):
        reply = replies.get(i)
        if reply is None or reply.has_error():
            reason = "no reply" if reply is None else reply.error.reason
            raise FederationError(f"SuperNode {node} did not answer the roll call: {reason}")
        report = wire.read_report(reply.content)
        if report["client"] in nodes:
            raise FederationError(f"two SuperNodes say they are client {report['client']}")
        nodes[report["client"]] = Node(node, report["n_samples"], report["noise_source"])
    if sorted(nodes) != list(range(n_clients)):
        raise FederationError(f"clients {sorted(nodes)} answered, the job has 0 … {n_clients - 1}")
    return nodes


@dataclass
class RemoteRound:
    """`train_round`'s trainer for round `index` (0-based): the sampled clients train on their
    nodes; returns the updates that arrived, in client order, and logs the round."""

    grid: Grid
    job: JobContext
    fed: Federation
    nodes: dict[int, Node]
    index: int
    timeout: float
    log: RoundLog

    def __call__(self, sampled: list[Client], global_state: dict) -> list[ClientUpdate]:
        plan = wire.plan_record(self.job, self.index, self.fed.model_arguments)
        arrays = wire.tensors_record(global_state)
        online = set(self.grid.get_node_ids())
        failed: dict[int, str] = {}
        messages = {}
        for client in sampled:
            node = self.nodes[client.index].node_id
            if node not in online:
                failed[client.index] = "SuperNode offline (no heartbeat)"
                continue
            content = RecordDict({wire.PLAN: plan, wire.GLOBAL: arrays})
            messages[client.index] = Message(
                content,
                dst_node_id=node,
                message_type=MessageType.TRAIN,
                group_id=str(self.index + 1),
            )
        print(f"round {self.index + 1}: sent to clients {sorted(messages)}", flush=True)
        replies = exchange(self.grid, messages, self.timeout) if messages else {}
        updates, reported = [], {}
        for client in sampled:
            reply = replies.get(client.index)
            if client.index in failed:
                continue
            if reply is None:
                failed[client.index] = f"no reply within round-timeout {self.timeout:g} s"
            elif reply.has_error():
                failed[client.index] = f"error {reply.error.code}: {reply.error.reason}"
            else:
                update, reported[client.index] = self.accept(client, reply)
                updates.append(update)
        self.log.rounds.append(
            {
                "round": self.index + 1,
                "sampled": [c.index for c in sampled],
                "received": sorted(reported),
                "failed": failed,
                "reported_epsilon": reported,
            }
        )
        if not updates:
            raise FederationError(f"round {self.index + 1}: no client update arrived: {failed}")
        return updates

    def accept(self, view: Client, reply: Message) -> tuple[ClientUpdate, float | None]:
        """Restore the client's view from its report, check the ε it reports against the
        view's, and return its update and that ε."""
        report = wire.read_report(reply.content)
        if report["client"] != view.index:
            raise FederationError(
                f"client {view.index}'s node answered as client {report['client']}"
            )
        wire.restore_view(view, report["privacy"])
        claimed, proven = report["ledger"]["epsilon"], view.epsilon()
        if (claimed is None) != (proven is None) or (
            proven is not None and not math.isclose(claimed, proven, rel_tol=1e-12)
        ):
            raise FederationError(
                f"client {view.index} reports epsilon {claimed}, its ledger gives {proven}"
            )
        device = next(self.fed.net.parameters()).device
        tensors = wire.record_tensors(reply.content.array_records[wire.UPDATE], device)
        return ClientUpdate(tensors, int(report["n_samples"]), report["ledger"]), claimed


def deployed_record(record: PrivacyRecord, log: RoundLog, nodes: dict[int, Node]) -> PrivacyRecord:
    """privacy.json's record with what the deployment changes: the clients' own noise source
    (when it is not dpmed's seeded default) and the updates that did not arrive."""
    extra, reasons = dict(record.extra), list(record.reasons)
    if "noise_source" in extra:
        sources = sorted({node.noise_source for node in nodes.values()})
        extra["noise_source"] = sources[0] if len(sources) == 1 else ", ".join(sources)
    if failures := log.failures():
        extra["failed_updates"] = failures
        reasons.append(FAILED_REASON)
    return replace(record, extra=extra, reasons=reasons)


def write_outputs(
    job: JobContext, fed: Federation, history: History, log: RoundLog, nodes: dict[int, Node]
) -> None:
    """rounds.csv, road.json, gradcam.npz, privacy.json and model.pt as the in-process run
    writes them (metrics.json, which times forward passes on a client's data, is not written),
    and federation.json (the nodes and the rounds' sampled, received and failed clients)."""
    import flwr

    out_dir, wc = Path(job.out_dir), job.wildcards
    write_csv(out_dir / "rounds.csv", pd.DataFrame(history.rows, columns=ROUND_COLUMNS))
    write_road(out_dir / "road.json", fed.evaluation, history)
    write_gradcam(out_dir / "gradcam.npz", fed.evaluation)
    record = privacy_record(fed.clients, fed.method, parse_eps(wc["eps"]), job.params)
    deployed_record(record, log, nodes).write(out_dir / "privacy.json", wc["dataset"])
    save_model(out_dir / "model.pt", wc["model"], fed.model_arguments, fed.net)
    federation = {
        "engine": f"flwr {flwr.__version__}",
        "nodes": {str(k): vars(node) for k, node in sorted(nodes.items())},
        "rounds": log.rounds,
    }
    write_json(out_dir / "federation.json", federation)


def serve(grid: Grid, job: JobContext, round_timeout: float, connect_timeout: float) -> None:
    """Run `job` over the federation `grid` reaches and write its outputs."""
    device = job.start()
    fed = build_federation(job, device, parts=[])
    nodes = roll_call(grid, job, fed.model_arguments, connect_timeout)
    fed.clients = [ledger_view(job, k, nodes[k].n_samples, fed, device) for k in sorted(nodes)]
    history = History({k: v.detach().clone() for k, v in fed.net.state_dict().items()})
    log = RoundLog()
    rounds = job.params["rounds"]
    progress = Progress(f"{PROGRESS_LABEL} {run_label(job.wildcards)}", rounds)
    for r in range(rounds):
        road_due = (r + 1) % job.params["road_every"] == 0 or r + 1 == rounds
        remote = RemoteRound(grid, job, fed, nodes, r, round_timeout, log)
        scores = train_round(fed, history, road_due, remote)
        progress.line(r + 1, scores, history.rows[-1]["epsilon"])
    write_outputs(job, fed, history, log, nodes)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the job the run config's `job` names (round-timeout, connect-timeout in s)."""
    config = context.run_config
    job = read_job(Path(str(config["job"])))
    serve(grid, job, float(config["round-timeout"]), float(config["connect-timeout"]))
