"""A malicious server against the XCal-FL ClientApp (`dpmed.xcal.flower.client_app`), in
process: crafted plans sent through the real ClientApp (Flower's message routing included) to
a node with its site's policy file and state folder. Every request beyond the policy or the
node's ledger is refused naming the key, a new run id continues the persisted ledger (the
same updates and ε as one uninterrupted in-process client), and after every scheduled round
and every attack the node's ε, recomputed from its recorded steps, is within its target."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FLOWER_WILDCARDS, XCAL_PARAMS, xcal_processed

pytest.importorskip("flwr")
from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict  # noqa: E402
from opacus.accountants.analysis.rdp import get_privacy_spent  # noqa: E402

from dpmed.privacy.accounting import ORDERS, compute_rdp  # noqa: E402
from dpmed.runtime import JobContext  # noqa: E402
from dpmed.xcal.client import Client  # noqa: E402
from dpmed.xcal.federation import client_partitions, client_schedule, initial_network, prepare  # noqa: E402
from dpmed.xcal.flower import client_app, wire  # noqa: E402
from dpmed.xcal.flower.policy import NodeLedger, PlanRefused, SitePolicy  # noqa: E402

# Three clients, two a round, three rounds: under seed 0 client 2 trains rounds 1 and 3 and
# is not sampled in round 2, where seed 1 would sample it.
PARAMS = {**XCAL_PARAMS, "rounds": 3, "clients_per_round": 2}
K, EPS = 2, 2.0
HONEST_ROUNDS = [0, 2]  # 0-based
WILDCARDS = FLOWER_WILDCARDS


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("policy_data"), [90, 10, 20])


def xcal_job(data: Path, wildcards: dict | None = None, params: dict | None = None) -> JobContext:
    wc = {**WILDCARDS, **(wildcards or {})}
    return JobContext(data, data, wc, {**PARAMS, **(params or {})}, 0, "cpu", 1)


def model_arguments(data: Path) -> dict:
    meta = json.loads((data / "meta.json").read_text())
    return {
        "in_channels": meta["channels"],
        "n_classes": meta["n_classes"],
        "image_size": meta["size"],
        "width_scale": PARAMS["width_scale"],
    }


class Node:
    """Client K's SuperNode: its site's policy file and state folder, asked through the real
    ClientApp by a server that sends whatever plan it likes."""

    def __init__(self, data: Path, root: Path, policy: SitePolicy) -> None:
        self.data, self.policy_path = data, root / "site" / "policy.json"
        policy.write(self.policy_path)
        self.config = {
            "partition-id": K,
            "data-dir": str(data),
            "policy": str(self.policy_path),
            "state-dir": str(root / "site" / "state"),
            "split": "dpmed",
            "seeds": "job",
        }
        self.arguments = model_arguments(data)
        net, _ = initial_network(WILDCARDS, self.arguments, torch.device("cpu"))
        self.global_state = net.state_dict()

    def ask(self, kind: str, job: JobContext, r: int, run_id: int = 1) -> Message:
        """Send the plan of `job` for 0-based round r (a train message carries the initial
        global model) in Flower run `run_id` (a fresh Context, as a new run gets)."""
        content = RecordDict({wire.PLAN: wire.plan_record(job, r, self.arguments)})
        if kind == MessageType.TRAIN:
            content[wire.GLOBAL] = ArrayRecord.from_torch_state_dict(self.global_state)
        msg = Message(content, dst_node_id=7, message_type=kind, group_id=str(r + 1))
        context = Context(run_id, 7, dict(self.config), RecordDict(), {})
        return client_app.app(msg, context)

    def train(self, job: JobContext, r: int, run_id: int = 1) -> Message:
        return self.ask(MessageType.TRAIN, job, r, run_id)

    @property
    def ledger_path(self) -> Path:
        return Path(self.config["state-dir"]) / f"xcal-client-{K}.pt"

    def ledger_bytes(self) -> bytes | None:
        return self.ledger_path.read_bytes() if self.ledger_path.exists() else None

    @property
    def ledger(self) -> NodeLedger:
        return NodeLedger.load(self.ledger_path, "")


@pytest.fixture
def node(data, tmp_path) -> Node:
    return Node(data, tmp_path, SitePolicy.for_job(xcal_job(data)))


def report(reply: Message) -> dict:
    return wire.read_report(reply.content)


# (what the server changes, the plan key the refusal names)
ATTACKS = {
    "nondp at eps inf": ({"method": "nondp", "eps": "inf"}, {}, "wildcards.method"),
    "eps 1e9": ({"eps": "1000000000"}, {}, "wildcards.eps"),
    "eps nan": ({"eps": "nan"}, {}, "wildcards.eps"),
    "delta 0.5": ({}, {"delta": 0.5}, "params.delta"),
    "delta 2": ({}, {"delta": 2.0}, "params.delta"),
    "clip norm 100": ({}, {"clip_norm": 100.0}, "params.clip_norm"),
    "seed wildcard 1": ({"seed": "1"}, {}, "wildcards.seed"),
    "20 rounds": ({}, {"rounds": 20}, "params.rounds"),
}


def attack_round(job: JobContext, trained: list[int]) -> int:
    """A round the attack's own schedule samples client K in and K has not trained in (the
    old ClientApp trained there)."""
    return next(r for r, s in enumerate(client_schedule(job)) if K in s and r not in trained)


def test_the_honest_plan_trains_and_its_round_is_saved_before_the_reply(node, data):
    reply = node.train(xcal_job(data), 0)
    assert set(reply.content.array_records) == {wire.UPDATE}
    sent = report(reply)
    assert sent["client"] == K and 0 < sent["ledger"]["epsilon"] <= EPS
    ledger = node.ledger
    assert ledger.trained == [0]
    assert ledger.client["rounds"] == 1 == sent["privacy"]["rounds"]
    assert ledger.client["method"] == sent["privacy"]["method"]


@pytest.mark.parametrize("attack", ATTACKS, ids=list(ATTACKS))
def test_a_server_that_changes_the_policy_after_a_dp_round_is_refused(node, data, attack):
    node.train(xcal_job(data), 0)
    wildcards, params, key = ATTACKS[attack]
    job = xcal_job(data, wildcards, params)
    before = node.ledger_bytes()
    with pytest.raises(PlanRefused, match=rf"client {K} refuses the plan: the plan's {key} "):
        node.train(job, attack_round(job, [0]))
    with pytest.raises(PlanRefused, match=rf"the plan's {key} "):  # the roll call too
        node.ask(MessageType.QUERY, job, -1, run_id=2)
    assert node.ledger_bytes() == before


def test_the_roll_call_of_the_policy_s_plan_is_answered(node, data):
    sent = report(node.ask(MessageType.QUERY, xcal_job(data), -1))
    assert sent["client"] == K
    assert sent["n_samples"] == len(client_partitions(xcal_job(data))[K][1])


def test_a_plan_other_than_the_ledger_s_is_refused_naming_the_key_and_the_file(node, data):
    node.train(xcal_job(data), 0)
    job = xcal_job(data, params={"batch_size": 4})  # within the policy, another q and T
    with pytest.raises(PlanRefused, match=r"another federation plan") as refused:
        node.train(job, 2, run_id=2)
    assert "params.batch_size" in str(refused.value)
    assert f"xcal-client-{K}.pt" in str(refused.value)
    with pytest.raises(PlanRefused, match=r"another federation plan"):  # the roll call too
        node.ask(MessageType.QUERY, job, -1, run_id=3)


@pytest.mark.parametrize(
    ("r", "reason"),
    [(1, "does not sample it"), (-1, r"rounds 1 … 3"), (3, r"rounds 1 … 3")],
)
def test_a_round_outside_the_schedule_is_refused(node, data, r, reason):
    with pytest.raises(PlanRefused, match=rf"client {K} refuses round {r + 1}: .*{reason}"):
        node.train(xcal_job(data), r)
    assert not node.ledger_path.exists()


def test_a_new_run_continues_the_ledger_as_one_uninterrupted_client(node, data, tmp_path):
    job = xcal_job(data)
    node.train(job, 0, run_id=1)
    with pytest.raises(PlanRefused, match=r"refuses round 1: it already trained"):
        node.train(job, 0, run_id=2)  # a new run id, a fresh Context.state
    second = node.train(job, 2, run_id=3)

    fed = prepare(replace(job, out_dir=tmp_path / "simulated"))[1]
    client = fed.clients[K]
    for _ in HONEST_ROUNDS:
        expected = client.train_round(fed.net, fed.wrapped, node.global_state)
    got = wire.record_tensors(second.content.array_records[wire.UPDATE], torch.device("cpu"))
    assert got.keys() == expected.tensors.keys()
    for name, tensor in expected.tensors.items():
        assert torch.allclose(got[name], tensor, atol=1e-6), name
    assert report(second)["ledger"]["epsilon"] == pytest.approx(client.account.epsilon(), rel=1e-12)
    assert node.ledger.trained == HONEST_ROUNDS


def independent_epsilon(client_state: dict, q: float, delta: float) -> float:
    """ε at δ of the node's releases from its step records alone: every gradient step's σ_t
    and every signal step (σ, q, count), each a subsampled Gaussian (dpmed's RDP curve, Opacus'
    conversion), summed; not the client's ledger or filter."""
    orders = list(ORDERS)
    rdp = np.zeros(len(orders))
    for sigma in client_state["stats"]["sigmas"]:
        rdp += compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)
    for sigma, rate, steps in client_state["method"]["signal_ledger"]["history"]:
        assert rate == q
        rdp += compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
    return float(get_privacy_spent(orders=orders, rdp=list(rdp), delta=delta)[0])


def test_after_every_round_and_attack_the_node_spent_within_its_target(node, data):
    job = xcal_job(data)
    for run_id, r in enumerate(HONEST_ROUNDS, start=1):
        node.train(job, r, run_id=run_id)
        for wildcards, params, _ in ATTACKS.values():
            attack = xcal_job(data, wildcards, params)
            with pytest.raises(PlanRefused):
                node.train(attack, attack_round(attack, [r]), run_id=10 + run_id)
        with pytest.raises(PlanRefused):
            node.train(job, r, run_id=20 + run_id)
    state = node.ledger.client
    n = len(client_partitions(job)[K][1])
    steps_per_epoch = math.ceil(n / PARAMS["batch_size"])
    planned_steps = len(HONEST_ROUNDS) * PARAMS["local_epochs"] * steps_per_epoch
    assert 0 < len(state["stats"]["sigmas"]) <= planned_steps
    spent = independent_epsilon(state, 1 / steps_per_epoch, PARAMS["delta"])
    print(f"client {K}: {len(state['stats']['sigmas'])} steps, eps spent {spent:.4f} <= {EPS}")
    assert 0 < spent <= EPS


def test_two_runs_at_once_cannot_train_one_round_twice(node, data, monkeypatch):
    job, rival_outcome, rival = xcal_job(data), [], threading.Thread(target=lambda: attempt())
    real_train_round = Client.train_round

    def attempt() -> None:
        try:
            rival_outcome.append(node.train(job, 0, run_id=2))
        except PlanRefused as refused:
            rival_outcome.append(refused)

    def train_round_with_a_rival(self, *args):
        if rival.ident is None:  # the first run's round: start a rival
            rival.start()
            rival.join(timeout=1.0)  # it waits for the ledger
        return real_train_round(self, *args)

    monkeypatch.setattr(Client, "train_round", train_round_with_a_rival)
    node.train(job, 0, run_id=1)
    rival.join(timeout=60)
    assert len(rival_outcome) == 1 and isinstance(rival_outcome[0], PlanRefused)
    assert "already trained" in str(rival_outcome[0])
    assert node.ledger.trained == [0]


@pytest.mark.parametrize("missing", ["policy", "state-dir"])
def test_a_node_without_a_policy_or_a_state_folder_refuses(node, data, missing):
    del node.config[missing]
    with pytest.raises(ValueError, match=rf"--node-config lacks {missing}"):
        node.ask(MessageType.QUERY, xcal_job(data), -1)


@pytest.mark.parametrize("eps", [EPS, math.inf])
def test_a_written_policy_reads_back(tmp_path, eps):
    policy = SitePolicy("xcal", eps, 1e-5, 1.0, 3, "0")
    policy.write(tmp_path / "policy.json")
    assert SitePolicy.read(tmp_path / "policy.json") == policy
    written = json.loads((tmp_path / "policy.json").read_text())["eps"]
    assert written == ("inf" if eps == math.inf else EPS)


GOOD = {"method": "xcal", "eps": 2, "delta": 1e-5, "clip_norm": 1.0, "max_rounds": 3, "seed": "0"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (json.dumps({k: v for k, v in GOOD.items() if k != "delta"}), "missing key delta"),
        (json.dumps({**GOOD, "sigma": 0.1}), "unknown key sigma"),
        (json.dumps(GOOD).replace('"eps": 2', '"eps": 1e999'), "key eps is inf"),
        (json.dumps(GOOD).replace('"eps": 2', '"eps": NaN'), "key eps is nan"),
        (json.dumps({**GOOD, "eps": -1}), "eps must be > 0"),
        (json.dumps({**GOOD, "eps": "2"}), "eps must be a number"),
        (json.dumps({**GOOD, "delta": 1.5}), r"delta must be in \(0, 1\)"),
        (json.dumps({**GOOD, "clip_norm": 0}), "clip_norm must be finite and > 0"),
        (json.dumps({**GOOD, "max_rounds": 2.5}), "max_rounds must be an integer"),
        (json.dumps({**GOOD, "max_rounds": 0}), "max_rounds must be ≥ 1"),
        (json.dumps({**GOOD, "seed": 0}), "seed must be a string"),
        (json.dumps({**GOOD, "method": True}), "method must be a string"),
        ("[1, 2]", "must be a JSON object"),
        ("{eps: 2", "cannot read it as JSON"),
    ],
)
def test_a_policy_file_error_names_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "policy.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        SitePolicy.read(path)
    assert str(path) in str(error.value)


def test_a_supernode_never_takes_its_settings_from_the_run_config():
    """A simulated client's node config is partition-id and num-partitions only; a SuperNode
    started with just those (no simulation engine in the process) refuses instead of taking
    its data, policy and ledger folder from the run config, which the server sets."""
    from dpmed.xcal.flower.runconfig import app_defaults

    config = {"partition-id": 0, "num-partitions": 3}
    context = Context(1, 7, config, RecordDict(), app_defaults())
    assert not client_app.simulation()
    with pytest.raises(ValueError, match="lacks data-dir, policy, state-dir"):
        client_app.node_settings(context)
