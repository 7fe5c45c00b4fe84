"""The XCal-FL ServerApp: dpmed's xcal server over Flower's Grid.

It runs the job its run config holds (`dpmed.xcal.flower.runconfig`) as
`dpmed.xcal.run.run` does, except that the sampled clients train on their SuperNodes: the same
federation without client data (`dpmed.xcal.federation`, no partitions), the same m-of-K
schedule, `train_round` with a remote trainer (`RemoteRound`): sample-weighted FedAvg over the
updates accepted, in client order, then the test evaluation. So with the same job, seeds,
partition and rounds the model equals the in-process run's.

The server trusts no client's word on privacy. It holds a view of every client (`ledger_view`:
a `ClientAccount`, calibrated from the public plan and the roll call's sample count) and
counts in it every round whose update arrived (`count_round`: a fixed-σ method's ledger is
charged as the client charges it; XCal-FL's proven ε depends only on that count and the
calibration). Each report is only checked against that view (`verify_report`): a round count,
ε, sample count or ledger that disagrees, or anything malformed, is refused by name; the
update is screened (`update_fault`: keys, shapes, dtypes, finite entries, norm). A refused or
screened-out update is left out of the round's average but still counts in its client's ε.
FedAvg weights are the roll call's sample counts. privacy.json and federation.json are
rewritten after every released round and when the run stops (`write_record`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from dpmed.config.wildcards import parse_eps
from dpmed.io import write_json
from dpmed.privacy.adaptive import RdpLedger
from dpmed.privacy.record import PrivacyRecord
from dpmed.runtime import JobContext, Progress
from dpmed.xcal.account import ClientAccount
from dpmed.xcal.client import ClientUpdate
from dpmed.xcal.federation import (
    Federation,
    TrainState,
    build_federation,
    run_label,
    train_round,
    write_model_outputs,
)
from dpmed.xcal.flower import PROGRESS_LABEL, wire
from dpmed.xcal.flower.runconfig import server_job
from dpmed.xcal.methods import FixedSigmaState, XCalState
from dpmed.xcal.privacy import privacy_record

POLL_SECONDS = 0.2  # how often the server asks the SuperLink for replies
# The most training images a roll call may declare for one site: far beyond any medical image
# collection of one hospital (every MedMNIST split has < 2e5), and a view of that size costs
# the server 80 MB of labels.
MAX_SAMPLES = 10**7
# Relative tolerance of a client's claimed ε or ledger against the server's recount: the same
# computation on another machine may round differently; a dishonest report differs by far more.
REL_TOL = 1e-9
TRAIN_KEYS = ("client", "n_samples", "ledger", "privacy")
ROLL_CALL_KEYS = ("client", "n_samples", "noise_source")
FAILED_REASON = (
    "a sampled client whose update did not arrive (extra.failed_updates) is left out of that "
    "round's average; its epsilon counts the rounds whose updates arrived (a client that "
    "trained before failing released nothing the server received)"
)
REFUSED_REASON = (
    "a sampled client whose update arrived but was refused (a report that disagrees with what "
    "the server observed, or an update that failed screening: extra.refused_updates) is left "
    "out of that round's average; its epsilon still counts that round"
)
# The largest L2 norm of a client's update w_k − w_global (float64, over the whole model) the
# xcal server averages: orders of magnitude beyond any local round of DP-SGD or SGD at this
# project's learning rates, and far below float32's range (3.4e38), so a FedAvg of screened
# updates stays within it of the last global model. (fets' `MAX_UPDATE_NORM`, 1e100, guards
# float64 Gram matrices and would let a float32 model take 1e30 weights.)
MAX_UPDATE_NORM = 1e9


app = ServerApp()


class FederationError(RuntimeError):
    """The federation cannot run the job (clients missing, a refused roll call, a round
    without any acceptable update, an aggregate that fails its check)."""


@dataclass(frozen=True)
class Node:
    """A client's SuperNode as the roll call found it."""

    node_id: int
    n_samples: int
    noise_source: str


@dataclass
class RoundLog:
    """federation.json's record: per round the clients sampled, received (their update arrived:
    counted in their ε), refused and failed (no update) with reasons, and each received
    client's ε as the server computes it; the rounds released; the run's status and what
    stopped it."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    status: str = "running"
    stopped: str | None = None

    def named(self, kind: str) -> list[dict[str, Any]]:
        """(round, client, reason) of every `kind` ("failed" or "refused") client."""
        return [
            {"round": r["round"], "client": k, "reason": reason}
            for r in self.rounds
            for k, reason in sorted(r[kind].items())
        ]

    def deployment(self) -> dict[str, Any]:
        """The run's status, released rounds and, after an error, what stopped it."""
        state = {"status": self.status, "released_rounds": list(self.released)}
        return state if self.stopped is None else {**state, "stopped": self.stopped}


def ledger_view(job: JobContext, k: int, n: int, fed: Federation) -> ClientAccount:
    """The server's view of client k with `n` samples: its account, the method state
    calibrated as the client's own (the same q, planned rounds and target)."""
    rounds = sum(k in sampled for sampled in fed.schedule)
    eps = parse_eps(job.wildcards["eps"])
    return ClientAccount.plan(k, n, fed.method, job.params, eps, planned_rounds=rounds)


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


def roll_call_node(content: RecordDict, n_clients: int, node_id: int) -> tuple[int, Node]:
    """(client number, Node) of a roll-call answer; Refused unless it names a client 0 … K−1,
    a sample count in 1 … `MAX_SAMPLES` and a noise source."""
    report = wire.read_report(content, ROLL_CALL_KEYS)
    k = wire.integer(report["client"], "client")
    n = wire.integer(report["n_samples"], "n_samples")
    if not 0 <= k < n_clients:
        raise wire.Refused("client", f"{k} outside the job's clients 0 … {n_clients - 1}")
    if not 1 <= n <= MAX_SAMPLES:
        raise wire.Refused("n_samples", f"{n} is not a count of 1 … {MAX_SAMPLES:.0e} images")
    if not isinstance(report["noise_source"], str):
        raise wire.Refused("noise_source", f"{report['noise_source']!r} is not a string")
    return k, Node(node_id, n, report["noise_source"])


def roll_call(grid: Grid, job: JobContext, arguments: dict, timeout: float) -> dict[int, Node]:
    """Wait for the job's K clients' SuperNodes and ask each which client it is; raises
    FederationError unless every client 0 … K−1 answers exactly once, acceptably
    (`roll_call_node`), within `timeout` s."""
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
        try:
            k, answer = roll_call_node(reply.content, n_clients, node)
        except wire.Refused as refusal:
            raise FederationError(f"SuperNode {node}'s roll call refused: {refusal}") from None
        if k in nodes:
            raise FederationError(f"two SuperNodes say they are client {k}")
        nodes[k] = answer
    if sorted(nodes) != list(range(n_clients)):
        raise FederationError(f"clients {sorted(nodes)} answered, the job has 0 … {n_clients - 1}")
    return nodes


def count_round(view: ClientAccount) -> None:
    """Count one more round whose update arrived in the server's view of a client: its round
    counter and, under a fixed-σ method, its ledger charged as the client charges it
    (local_epochs × S steps, each asking the method for its σ: the RDP sums bit for bit) and
    its step count."""
    view.rounds += 1
    if isinstance(view.state, FixedSigmaState):
        steps = view.params["local_epochs"] * view.steps_per_epoch
        view.stats.sigmas += [view.method.next_sigma(view, None) for _ in range(steps)]
        view.stats.steps += steps


def expect(where: str, claimed: Any, observed: Any) -> None:
    """Refused unless a report's `claimed` value equals what the server `observed`."""
    if claimed != observed:
        raise wire.Refused(where, f"claims {claimed!r}, the server observed {observed!r}")


def expect_epsilon(where: str, claimed: Any, observed: float | None) -> None:
    """Refused unless a claimed ε (or reading) is the server's: None when it is None, else a
    finite number within `REL_TOL` of it."""
    if observed is None:
        ok = claimed is None
    else:
        ok = math.isclose(wire.number(claimed, where), observed, rel_tol=REL_TOL)
    if not ok:
        raise wire.Refused(where, f"claims {claimed!r}, the server computes {observed!r}")


def same_charges(where: str, reported: RdpLedger, charged: RdpLedger) -> None:
    """Refused unless a fixed-σ client's reported ledger is the one the server charged."""
    pairs = zip(reported.history, charged.history, strict=False)
    same = len(reported.history) == len(charged.history) and all(
        a[2] == b[2] and np.allclose(a[:2], b[:2], rtol=REL_TOL, atol=0) for a, b in pairs
    )
    if not same:
        raise wire.Refused(
            where, f"charges {reported.history}, the server charged {charged.history}"
        )
    if not np.allclose(reported.rdp, charged.rdp, rtol=REL_TOL, atol=0):
        raise wire.Refused(f"{where}.rdp", "differs from the RDP of the steps the server charged")


def within_plan(
    where: str, ledger: RdpLedger, view: ClientAccount, sigmas: tuple[float, float]
) -> int:
    """The steps `ledger` charges; Refused unless each is at the client's q with σ in
    `sigmas` (low, high) and they are no more than the plan allows the server's round count."""
    low, high = sigmas
    for sigma, q, _ in ledger.history:
        in_band = low * (1 - REL_TOL) <= sigma <= high * (1 + REL_TOL)
        if not (in_band and math.isclose(q, view.q, rel_tol=REL_TOL)):
            plan = f"the plan has q {view.q}, sigma in [{low}, {high}]"
            raise wire.Refused(where, f"a charge at sigma {sigma}, q {q}; {plan}")
    steps = sum(n for _, _, n in ledger.history)
    if steps > view.planned_steps_so_far:
        allowed = f"{view.planned_steps_so_far} in the {view.rounds} rounds the server counted"
        raise wire.Refused(where, f"{steps} steps, the plan allows {allowed}")
    return steps


def verify_filter(view: ClientAccount, method: dict[str, Any], ledger: dict[str, Any]) -> int:
    """The gradient steps of an XCal-FL client's reported filter; Refused unless its filter
    and signal ledgers are well-formed, within the plan (σ_t in the band, the signal at its
    σ_s) and the filter's budget, and the ledger message repeats them."""
    state: XCalState = view.state
    flt = wire.mapping(method.get("filter"), "privacy.method.filter")
    gradient = wire.rdp_ledger(flt.get("ledger"), "privacy.method.filter.ledger")
    signal = wire.rdp_ledger(method.get("signal_ledger"), "privacy.method.signal_ledger")
    if not isinstance(flt.get("halted"), bool) or wire.integer(flt.get("raised"), "raised") < 0:
        raise wire.Refused("privacy.method.filter", "halted is not a bool or raised < 0")
    if not 0 <= wire.number(method.get("smoothed"), "privacy.method.smoothed") <= 1:
        raise wire.Refused("privacy.method.smoothed", "outside [0, 1]")
    repeated = {"gradient": flt["ledger"], "signal": method["signal_ledger"]}
    for key, value in {**repeated, "halted": flt["halted"]}.items():
        if ledger.get(key) != value:
            raise wire.Refused(f"ledger.{key}", "differs from the report's privacy state")
    band = (1 - view.params["band"], 1 + view.params["band"])
    steps = within_plan(
        "privacy.method.filter.ledger", gradient, view, tuple(b * state.sigma_ref for b in band)
    )
    sigma_s = state.sigma_signal
    within_plan("privacy.method.signal_ledger", signal, view, (sigma_s, sigma_s))
    spent = float(gradient.rdp[state.filter.order_index])
    if spent > state.filter.budget * (1 + REL_TOL):
        raise wire.Refused(
            "privacy.method.filter.ledger",
            f"RDP {spent} at order {state.filter.order} beyond the filter's budget "
            f"{state.filter.budget}",
        )
    return steps


def verify_report(view: ClientAccount, report: dict[str, Any], n_samples: int) -> None:
    """Refused (naming the field, the claim and what the server observed) unless client
    `view`'s report agrees with the server's view of it: the same client, the roll call's
    sample count, the server's round count and ε, and well-formed step statistics and ledgers
    within the public plan (under a fixed-σ method, the ledger the server charged)."""
    expect("client", wire.integer(report["client"], "client"), view.index)
    expect("n_samples", wire.integer(report["n_samples"], "n_samples"), n_samples)
    privacy = wire.mapping(report["privacy"], "privacy")
    ledger = wire.mapping(report["ledger"], "ledger")
    expect("privacy.rounds", wire.integer(privacy.get("rounds"), "privacy.rounds"), view.rounds)
    expect_epsilon("ledger.epsilon", ledger.get("epsilon"), view.epsilon())
    stats = wire.step_stats(privacy.get("stats"), "privacy.stats")
    method = wire.mapping(privacy.get("method"), "privacy.method")
    state = view.state
    if isinstance(state, FixedSigmaState):
        reported = {
            "ledger.gradient": ledger.get("gradient"),
            "privacy.method.ledger": method.get("ledger"),
        }
        for where, value in reported.items():
            same_charges(where, wire.rdp_ledger(value, where), state.ledger)
        steps = sum(n for _, _, n in state.ledger.history)
    elif isinstance(state, XCalState):
        steps = verify_filter(view, method, ledger)
    else:  # non-private: no ledger
        steps = stats.steps
    sigmas = steps if view.method.dp else 0
    if (stats.steps, len(stats.sigmas)) != (steps, sigmas) or steps > view.planned_steps_so_far:
        expected = f"{steps} steps and {sigmas} sigmas, at most {view.planned_steps_so_far}"
        raise wire.Refused(
            "privacy.stats", f"{stats.steps} steps and {len(stats.sigmas)} sigmas, not {expected}"
        )


@dataclass
class RemoteRound:
    """`train_round`'s trainer for round `index` (0-based): the sampled clients train on their
    nodes; returns the updates accepted, in client order, and logs the round."""

    grid: Grid
    job: JobContext
    fed: Federation
    nodes: dict[int, Node]
    index: int
    timeout: float
    log: RoundLog

    def __call__(self, sampled: list[int], global_state: dict) -> list[ClientUpdate]:
        plan = wire.plan_record(self.job, self.index, self.fed.model_arguments)
        arrays = ArrayRecord.from_torch_state_dict(global_state)
        online = set(self.grid.get_node_ids())
        failed: dict[int, str] = {}
        messages = {}
        for k in sampled:
            node = self.nodes[k].node_id
            if node not in online:
                failed[k] = "SuperNode offline (no heartbeat)"
                continue
            content = RecordDict({wire.PLAN: plan, wire.GLOBAL: arrays})
            messages[k] = Message(
                content,
                dst_node_id=node,
                message_type=MessageType.TRAIN,
                group_id=str(self.index + 1),
            )
        print(f"round {self.index + 1}: sent to clients {sorted(messages)}", flush=True)
        replies = exchange(self.grid, messages, self.timeout) if messages else {}
        entry = {
            "round": self.index + 1,
            "sampled": list(sampled),
            "received": [],
            "refused": {},
            "failed": failed,
            "epsilon": {},
        }
        self.log.rounds.append(entry)
        updates = []
        for client in (self.fed.accounts[k] for k in sampled):
            reply = replies.get(client.index)
            if client.index in failed:
                continue
            if reply is None:
                failed[client.index] = f"no reply within round-timeout {self.timeout:g} s"
            elif reply.has_error():
                failed[client.index] = f"error {reply.error.code}: {reply.error.reason}"
            elif wire.UPDATE not in reply.content.array_records:
                failed[client.index] = "a reply without an update"
            else:
                entry["received"].append(client.index)
                try:
                    updates.append(self.accept(client, reply.content, global_state))
                except wire.Refused as refusal:
                    entry["refused"][client.index] = str(refusal)
                    what = f"round {self.index + 1}: refused client {client.index}'s update"
                    print(f"{what}: {refusal}", flush=True)
                entry["epsilon"][client.index] = client.epsilon()
        if not updates:
            named = sorted({**failed, **entry["refused"]}.items())
            reasons = "; ".join(f"client {k}: {why}" for k, why in named)
            raise FederationError(f"round {self.index + 1}: no acceptable update ({reasons})")
        return updates

    def accept(self, view: ClientAccount, content: RecordDict, global_state: dict) -> ClientUpdate:
        """Count the round in client `view`'s ε (its update arrived), check its report against
        the view (`verify_report`), screen its update against `global_state`, and restore the
        view's informational readings; the update, weighted by the roll call's sample count.
        Raises wire.Refused naming the field or tensor at fault."""
        count_round(view)
        n_samples = self.nodes[view.index].n_samples
        report = wire.read_report(content, TRAIN_KEYS)
        verify_report(view, report, n_samples)
        device = next(self.fed.net.parameters()).device
        tensors = wire.record_tensors(content.array_records[wire.UPDATE], device)
        if fault := update_fault(global_state, tensors):
            raise wire.Refused(f"tensor {fault[0]!r}", fault[1])
        before = view.privacy_state()
        wire.restore_readings(view, report["privacy"])
        try:
            reading = report["ledger"].get("eps_realised_reading")
            expect_epsilon("ledger.eps_realised_reading", reading, view.realised_epsilon())
        except wire.Refused:
            wire.restore_readings(view, before)
            raise
        return ClientUpdate(tensors, n_samples, report["ledger"])


def deployed_record(record: PrivacyRecord, log: RoundLog, nodes: dict[int, Node]) -> PrivacyRecord:
    """privacy.json's record with what the deployment changes: the clients' own noise source
    (when it is not dpmed's seeded default), the updates that did not arrive or were refused,
    and, until the run completes, its status and released rounds (`extra.deployment`)."""
    extra, reasons = dict(record.extra), list(record.reasons)
    if "noise_source" in extra:
        sources = sorted({node.noise_source for node in nodes.values()})
        extra["noise_source"] = sources[0] if len(sources) == 1 else ", ".join(sources)
    if failures := log.named("failed"):
        extra["failed_updates"] = failures
        reasons.append(FAILED_REASON)
    if refusals := log.named("refused"):
        extra["refused_updates"] = refusals
        reasons.append(REFUSED_REASON)
    if log.status != "completed":
        extra["deployment"] = log.deployment()
    return replace(record, extra=extra, reasons=reasons)


def write_record(job: JobContext, fed: Federation, log: RoundLog, nodes: dict[int, Node]) -> None:
    """privacy.json from the server's views (once the roll call made them) and federation.json
    (the nodes, the rounds' sampled, received, refused and failed clients, the status), both
    atomically: a true record of the rounds released so far."""
    import flwr

    out_dir, wc = Path(job.out_dir), job.wildcards
    if fed.accounts:
        record = privacy_record(fed.accounts, fed.method, parse_eps(wc["eps"]), job.params)
        deployed_record(record, log, nodes).write(out_dir / "privacy.json", wc["dataset"])
    federation = {
        "engine": f"flwr {flwr.__version__}",
        "nodes": {str(k): vars(node) for k, node in sorted(nodes.items())},
        "rounds": log.rounds,
        **log.deployment(),
    }
    write_json(out_dir / "federation.json", federation)


def update_fault(
    reference: Mapping[str, Any], tensors: Mapping[str, Any]
) -> tuple[str, str] | None:
    """(tensor, reason) of the first way the torch state dict `tensors` fails as an update of
    the model `reference`: a missing or extra key, another shape or dtype, a non-finite entry,
    or ‖tensors − reference‖ beyond `MAX_UPDATE_NORM` (naming its largest tensor); None when
    it passes."""
    if missing := [k for k in reference if k not in tensors]:
        return missing[0], "missing"
    if extra := [k for k in tensors if k not in reference]:
        return extra[0], "not a tensor of the model"
    sq_norms = {}
    for name, ref in reference.items():
        value = tensors[name]
        if value.shape != ref.shape or value.dtype != ref.dtype:
            got, want = (tuple(value.shape), value.dtype), (tuple(ref.shape), ref.dtype)
            return name, f"shape and dtype {got}, the model's are {want}"
        if not bool(torch.isfinite(value).all()):
            return name, "non-finite entries"
        sq_norms[name] = float(torch.sum((value.double() - ref.double()) ** 2))
    norm = math.sqrt(sum(sq_norms.values()))
    if norm <= MAX_UPDATE_NORM:
        return None
    worst = max(sq_norms, key=sq_norms.__getitem__)
    return worst, f"update norm {norm:.3g} beyond the limit {MAX_UPDATE_NORM:.0e}"


def serve(grid: Grid, job: JobContext, round_timeout: float, connect_timeout: float) -> None:
    """Run `job` over the federation `grid` reaches and write its outputs; whatever stops it,
    privacy.json and federation.json name the rounds released and the error."""
    device = job.start()
    fed = build_federation(job, device, parts=[])
    log, nodes = RoundLog(), {}
    try:
        nodes.update(roll_call(grid, job, fed.model_arguments, connect_timeout))
        fed.accounts = [ledger_view(job, k, nodes[k].n_samples, fed) for k in sorted(nodes)]
        history = TrainState.start(fed.net)
        rounds = job.params["rounds"]
        progress = Progress(f"{PROGRESS_LABEL} {run_label(job.wildcards)}", rounds)
        for r in range(rounds):
            road_due = (r + 1) % job.params["road_every"] == 0 or r + 1 == rounds
            remote = RemoteRound(grid, job, fed, nodes, r, round_timeout, log)
            previous = history.global_state
            scores = train_round(fed, history, road_due, remote)
            if fault := update_fault(previous, history.global_state):  # as an update is screened
                where = f"round {r + 1}: the aggregate's tensor {fault[0]!r}"
                raise FederationError(f"{where}: {fault[1]}")
            log.released.append(r + 1)
            write_record(job, fed, log, nodes)
            progress.line(r + 1, scores, history.rows[-1]["epsilon"])
        write_model_outputs(job, fed, history)  # no metrics.json: it times a client's data
        log.status = "completed"
        write_record(job, fed, log, nodes)
    except BaseException as error:
        log.status, log.stopped = "failed", f"{type(error).__name__}: {error}"
        write_record(job, fed, log, nodes)
        raise


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the job the run config holds (round-timeout, connect-timeout in s)."""
    config = context.run_config
    job = server_job(config)
    serve(grid, job, float(config["round-timeout"]), float(config["connect-timeout"]))
