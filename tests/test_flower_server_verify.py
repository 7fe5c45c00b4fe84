"""The Flower ServerApp against malicious clients, in-process: reports and updates of honest
dpmed clients (`dpmed.xcal.run.prepare`, `Client.train_round`, `wire.report_record`) tampered
with, fed to the real server code (`RemoteRound.accept`, `roll_call`, `serve` over a Grid whose
SuperNodes are those in-process clients). Every attack is refused or screened by name, the
server's ε stays its own recount, and a run that stops leaves a privacy record of the rounds it
released."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from conftest import XCAL_PARAMS, xcal_processed

from dpmed.models import load_model
from dpmed.privacy import accounting
from dpmed.privacy.adaptive import epsilon_of
from dpmed.privacy.mechanisms import NOISE_SEEDED
from dpmed.runtime import JobContext
from dpmed.xcal.federation import build_federation, prepare
from dpmed.xcal.run import run

pytest.importorskip("flwr")
from flwr.app import ArrayRecord, ConfigRecord, RecordDict  # noqa: E402

from dpmed.xcal.flower import wire  # noqa: E402
from dpmed.xcal.flower.server_app import (  # noqa: E402
    MAX_UPDATE_NORM,
    REFUSED_REASON,
    FederationError,
    Node,
    RemoteRound,
    RoundLog,
    ledger_view,
    roll_call,
    serve,
    update_fault,
)

# Two rounds, both clients each round, two local steps per round (30 images, batch 16).
PARAMS = {**XCAL_PARAMS, "rounds": 2, "road_subsample": 4}
NODE = 100  # client k's SuperNode id is NODE + k


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("verify_data"), [60, 10, 20])


def xcal_job(data: Path, out: Path, method: str = "static", eps: str = "2") -> JobContext:
    wc = {
        "dataset": "bloodmnist",
        "model": "resnet18",
        "method": method,
        "shift": "iid",
        "clients": "2",
        "eps": eps,
        "seed": "0",
    }
    return JobContext(data, out, wc, PARAMS, seed=0, device="cpu", threads=1)


@dataclass
class Honest:
    """An honest client's round-1 reply (report as a dict, update tensors), the global model it
    trained from and the client itself (the simulation's)."""

    job: JobContext
    global_state: dict[str, torch.Tensor]
    report: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    client: Any


def honest_round(job: JobContext) -> Honest:
    fed = prepare(job)[1]
    global_state = {k: v.detach().clone() for k, v in fed.net.state_dict().items()}
    client = fed.clients[0]
    update = client.train_round(fed.net, fed.wrapped, global_state)
    report = json.loads(str(wire.report_record(client, update, NOISE_SEEDED)["json"]))
    return Honest(job, global_state, report, update.tensors, client)


@pytest.fixture(scope="module")
def static(data, tmp_path_factory) -> Honest:
    return honest_round(xcal_job(data, tmp_path_factory.mktemp("static")))


@pytest.fixture(scope="module")
def xcal(data, tmp_path_factory) -> Honest:
    return honest_round(xcal_job(data, tmp_path_factory.mktemp("xcal"), "xcal"))


def server_round(job: JobContext, n_samples: list[int]) -> RemoteRound:
    """Round 1 of the server of `job` whose roll call found `n_samples`, with fresh views."""
    device = torch.device("cpu")
    fed = build_federation(job, device, parts=[])
    nodes = {k: Node(NODE + k, n, NOISE_SEEDED) for k, n in enumerate(n_samples)}
    fed.accounts = [ledger_view(job, k, n, fed) for k, n in enumerate(n_samples)]
    return RemoteRound(None, job, fed, nodes, 0, 1.0, RoundLog())


def reply(report: dict[str, Any] | str, tensors: dict[str, torch.Tensor]) -> RecordDict:
    text = report if isinstance(report, str) else json.dumps(report)
    return RecordDict(
        {
            wire.UPDATE: ArrayRecord.from_torch_state_dict(tensors),
            wire.REPORT: ConfigRecord({"json": text}),
        }
    )


def attacked(honest: Honest, attack) -> tuple[RemoteRound, Any]:
    """(the server's round, the refusal) of `honest`'s reply after `attack(report, tensors)`."""
    report, tensors = (
        copy.deepcopy(honest.report),
        {k: v.clone() for k, v in honest.tensors.items()},
    )
    report = attack(report, tensors) or report
    remote = server_round(honest.job, [honest.client.account.n, honest.client.account.n])
    view = remote.fed.accounts[0]
    with pytest.raises(wire.Refused) as refusal:
        remote.accept(view, reply(report, tensors), honest.global_state)
    return remote, refusal.value


def scaled(state: dict, factor: float) -> dict:
    """A ledger state with its RDP and step counts multiplied by `factor`."""
    return {
        "rdp": [v * factor for v in state["rdp"]],
        "history": [[s, q, int(n * factor)] for s, q, n in state["history"]],
    }


def fixed_ledgers(report: dict, state: dict) -> None:
    """Put ledger `state` in both places a fixed-σ report holds its ledger."""
    report["ledger"]["gradient"] = state
    report["privacy"]["method"]["ledger"] = copy.deepcopy(state)


ZERO = {"rdp": [0.0] * 255, "history": []}


def zero_claiming_zero(report, tensors):
    fixed_ledgers(report, ZERO)
    report["ledger"]["epsilon"] = report["ledger"]["eps_realised_reading"] = 0.0


def doubled(report, tensors, claim_doubled=True):
    fixed_ledgers(report, scaled(report["ledger"]["gradient"], 2))
    if claim_doubled:
        eps = epsilon_of(np.array(report["ledger"]["gradient"]["rdp"]), PARAMS["delta"])
        report["ledger"]["epsilon"] = report["ledger"]["eps_realised_reading"] = eps


def infinite(report, tensors, claim=math.inf):
    fixed_ledgers(report, {"rdp": [math.inf] * 255, "history": [[math.inf, 0.5, 4]]})
    report["ledger"]["epsilon"] = claim


def first_float(tensors: dict[str, torch.Tensor]) -> str:
    return next(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 1)


def poison(value: float):
    def attack(report, tensors):
        tensors[first_float(tensors)].view(-1)[0] = value

    return attack


def setter(*path_and_value):
    *path, value = path_and_value

    def attack(report, tensors):
        target = report
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value(target[path[-1]]) if callable(value) else value

    return attack


def without(key):
    def attack(report, tensors):
        del report[key]

    return attack


def reshaped(report, tensors):
    tensors[first_float(tensors)] = torch.full((1,), 500.0)


def missing_key(report, tensors):
    del tensors[first_float(tensors)]


def extra_key(report, tensors):
    tensors["backdoor.weight"] = torch.zeros(3)


def float64(report, tensors):
    name = first_float(tensors)
    tensors[name] = tensors[name].double()


def unparsable(report, tensors):
    return "{'client': 0,"


# name: (attack, the field or tensor the refusal names first)
STATIC_ATTACKS = {
    "all-zero ledger claiming eps 0": (zero_claiming_zero, "ledger.epsilon"),
    "all-zero ledger, true eps": (lambda r, t: fixed_ledgers(r, ZERO), "ledger.gradient"),
    "doubled ledger claiming its eps": (doubled, "ledger.epsilon"),
    "doubled ledger, true eps": (lambda r, t: doubled(r, t, False), "ledger.gradient"),
    "all-inf ledger claiming eps inf": (infinite, "ledger.epsilon"),
    "all-inf ledger, true eps": (
        lambda r, t: infinite(r, t, r["ledger"]["epsilon"]),
        "ledger.gradient.rdp",
    ),
    "eps NaN": (setter("ledger", "epsilon", math.nan), "ledger.epsilon"),
    "eps beyond float": (setter("ledger", "epsilon", 10**400), "ledger.epsilon"),
    "eps lowered": (setter("ledger", "epsilon", lambda e: e / 2), "ledger.epsilon"),
    "privacy.rounds = 0": (setter("privacy", "rounds", 0), "privacy.rounds"),
    "stats claim more steps": (setter("privacy", "stats", "steps", 99), "privacy.stats"),
    "another client's number": (setter("client", 1), "client"),
    "n_samples 1e9": (setter("n_samples", 1e9), "n_samples"),
    "n_samples -1e9": (setter("n_samples", -(10**9)), "n_samples"),
    "no privacy": (without("privacy"), "privacy"),
    "no ledger": (without("ledger"), "ledger"),
    "unparsable report": (unparsable, "report"),
    "NaN weight": (poison(math.nan), "tensor"),
    "inf weight": (poison(math.inf), "tensor"),
    "1e30 weight": (poison(1e30), "tensor"),
    "(1,)-shaped tensor": (reshaped, "tensor"),
    "missing tensor": (missing_key, "tensor"),
    "extra tensor": (extra_key, "tensor 'backdoor.weight'"),
    "float64 tensor": (float64, "tensor"),
}


def static_epsilon(n: int, rounds: int) -> float:
    """The static ε at target 2 of a client of `n` samples after `rounds`, recounted from the
    public plan alone: q = 1/ceil(n/B), σ calibrated to all its planned steps, local_epochs · S
    steps per round."""
    p = PARAMS
    steps_per_round = p["local_epochs"] * math.ceil(n / p["batch_size"])
    q = 1 / math.ceil(n / p["batch_size"])
    sigma = accounting.noise_multiplier(2.0, p["delta"], q, p["rounds"] * steps_per_round)
    return accounting.epsilon([(sigma, q, rounds * steps_per_round)], p["delta"])


def test_an_honest_report_is_accepted_and_eps_is_the_servers_recount(static):
    remote = server_round(static.job, [static.client.account.n, static.client.account.n])
    view = remote.fed.accounts[0]
    update = remote.accept(view, reply(static.report, static.tensors), static.global_state)
    assert view.rounds == 1
    assert math.isclose(view.epsilon(), static_epsilon(static.client.account.n, 1), rel_tol=1e-9)
    assert view.epsilon() == static.client.account.epsilon()  # the client's own ledger, bit for bit
    assert update.n_samples == static.client.account.n
    assert all(torch.equal(update.tensors[k], v) for k, v in static.tensors.items())


@pytest.mark.parametrize("name", list(STATIC_ATTACKS))
def test_a_tampered_report_or_update_is_refused_by_name(static, name):
    attack, where = STATIC_ATTACKS[name]
    remote, refusal = attacked(static, attack)
    print(f"{name}: refused: {refusal}")
    assert str(refusal).startswith(where), str(refusal)
    view = remote.fed.accounts[0]
    # the update arrived, so the round counts in the server's ε, whatever the report says
    assert view.rounds == 1
    assert view.epsilon() == static.client.account.epsilon()


def test_screening_names_the_tensor_and_the_fault(static):
    name = first_float(static.tensors)
    for attack, fault in [
        (poison(math.nan), "non-finite entries"),
        (poison(1e30), "update norm 1e+30 beyond the limit 1e+09"),
        (reshaped, "shape and dtype ((1,), torch.float32)"),
        (missing_key, "missing"),
    ]:
        _, refusal = attacked(static, attack)
        assert str(refusal).startswith(f"tensor {name!r}: {fault}"), str(refusal)


def test_the_aggregate_check_refuses_a_non_finite_or_absurd_model(static):
    name = first_float(static.tensors)
    assert update_fault(static.global_state, static.tensors) is None
    for value, fault in [(math.nan, "non-finite entries"), (2 * MAX_UPDATE_NORM, "update norm")]:
        model = {k: v.clone() for k, v in static.tensors.items()}
        model[name].view(-1)[0] = value
        assert update_fault(static.global_state, model)[0] == name
        assert update_fault(static.global_state, model)[1].startswith(fault)


def test_xcal_eps_is_the_servers_whatever_the_ledger_says(xcal):
    remote = server_round(xcal.job, [xcal.client.account.n, xcal.client.account.n])
    view = remote.fed.accounts[0]
    remote.accept(view, reply(xcal.report, xcal.tensors), xcal.global_state)
    assert view.epsilon() == xcal.client.account.epsilon()
    assert view.realised_epsilon() == xcal.client.account.realised_epsilon()
    assert view.stats.sigmas == xcal.client.account.stats.sigmas

    # a consistent but false report (no steps, zero ledgers, zero reading) cannot move ε
    report = copy.deepcopy(xcal.report)
    report["privacy"]["method"]["filter"]["ledger"] = report["ledger"]["gradient"] = ZERO
    report["privacy"]["method"]["signal_ledger"] = report["ledger"]["signal"] = ZERO
    report["privacy"]["stats"].update(steps=0, sigmas=[], signals=[])
    report["ledger"]["eps_realised_reading"] = 0.0
    remote = server_round(xcal.job, [xcal.client.account.n, xcal.client.account.n])
    view = remote.fed.accounts[0]
    remote.accept(view, reply(report, xcal.tensors), xcal.global_state)
    assert view.epsilon() == xcal.client.account.epsilon() > 0


def below_band(report, tensors):
    history = report["privacy"]["method"]["filter"]["ledger"]["history"]
    history[0][0] /= 2
    report["ledger"]["gradient"] = report["privacy"]["method"]["filter"]["ledger"]


def beyond_budget(report, tensors):
    state = report["privacy"]["method"]["filter"]["ledger"]
    state["rdp"] = [v * 1e6 for v in state["rdp"]]
    report["ledger"]["gradient"] = state


XCAL_ATTACKS = {
    "eps lowered": (setter("ledger", "epsilon", lambda e: e * 0.9), "ledger.epsilon"),
    "privacy.rounds = 0": (setter("privacy", "rounds", 0), "privacy.rounds"),
    "sigma below the band": (below_band, "privacy.method.filter.ledger"),
    "filter beyond its budget": (beyond_budget, "privacy.method.filter.ledger"),
    "message differs from state": (
        setter("ledger", "gradient", ZERO),
        "ledger.gradient",
    ),
    "zero ledger, true stats": (
        lambda r, t: (
            r["privacy"]["method"]["filter"].update(ledger=ZERO)
            or r["ledger"].update(gradient=ZERO)
        ),
        "privacy.stats",
    ),
    "realised reading lowered": (
        setter("ledger", "eps_realised_reading", lambda e: e / 2),
        "ledger.eps_realised_reading",
    ),
    "signal ledger inf": (
        setter("privacy", "method", "signal_ledger", "rdp", [math.inf] * 255),
        "privacy.method.signal_ledger.rdp",
    ),
}


@pytest.mark.parametrize("name", list(XCAL_ATTACKS))
def test_a_tampered_xcal_report_is_refused_by_name(xcal, name):
    attack, where = XCAL_ATTACKS[name]
    remote, refusal = attacked(xcal, attack)
    print(f"{name}: refused: {refusal}")
    assert str(refusal).startswith(where), str(refusal)
    view = remote.fed.accounts[0]
    assert view.rounds == 1 and view.epsilon() == xcal.client.account.epsilon()
    assert view.stats.steps == 0  # a refused report restores no reading


# ------------------------------------------------------------------ a Grid of in-process nodes


class Grid:
    """A Flower Grid whose SuperNodes (ids NODE + k) are the honest clients of
    `prepare(job)`; `tamper(round, client, report, tensors)` (0-based round, -1: the roll
    call) may change a reply before it is encoded."""

    def __init__(self, job: JobContext, tamper=None) -> None:
        self.fed = prepare(job)[1]
        self.tamper = tamper or (lambda r, k, report, tensors: None)
        self.replies: dict[str, SimpleNamespace] = {}

    def get_node_ids(self) -> list[int]:
        return [NODE + k for k in range(len(self.fed.clients))]

    def push_messages(self, messages) -> list[str]:
        ids = []
        for message in messages:
            mid = f"message-{len(self.replies)}"
            content = self.answer(message.metadata.dst_node_id - NODE, message.content)
            metadata = SimpleNamespace(reply_to_message_id=mid)
            self.replies[mid] = SimpleNamespace(
                content=content, metadata=metadata, has_error=lambda: False
            )
            ids.append(mid)
        return ids

    def pull_messages(self, ids) -> list[SimpleNamespace]:
        return [self.replies[mid] for mid in ids]

    def answer(self, k: int, content: RecordDict) -> RecordDict:
        client = self.fed.clients[k]
        r = json.loads(str(content.config_records[wire.PLAN]["json"]))["round"]
        if r < 0:
            report = {"client": k, "n_samples": client.account.n, "noise_source": NOISE_SEEDED}
            self.tamper(r, k, report, {})
            return RecordDict({wire.REPORT: ConfigRecord({"json": json.dumps(report)})})
        global_state = wire.record_tensors(content.array_records[wire.GLOBAL], client.x.device)
        update = client.train_round(self.fed.net, self.fed.wrapped, global_state)
        report = json.loads(str(wire.report_record(client, update, NOISE_SEEDED)["json"]))
        self.tamper(r, k, report, update.tensors)
        return reply(report, update.tensors)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_model(path / "model.pt").state_dict()


@pytest.mark.parametrize(("method", "eps"), [("static", "2"), ("xcal", "2"), ("nondp", "inf")])
def test_an_honest_served_run_equals_the_simulation(data, tmp_path, method, eps):
    job = xcal_job(data, tmp_path / "served", method, eps)
    serve(Grid(replace(job, out_dir=tmp_path / "nodes")), job, 10.0, 10.0)
    run(replace(job, out_dir=tmp_path / "simulated"))
    for name in ("privacy.json", "road.json"):
        served = (tmp_path / "served" / name).read_text()
        assert served == (tmp_path / "simulated" / name).read_text(), name
    a, b = weights(tmp_path / "served"), weights(tmp_path / "simulated")
    assert all(torch.equal(a[k], b[k]) for k in a)
    federation = json.loads((tmp_path / "served" / "federation.json").read_text())
    assert federation["status"] == "completed" and federation["released_rounds"] == [1, 2]
    assert [r["received"] for r in federation["rounds"]] == [[0, 1], [0, 1]]


def test_a_refused_client_is_left_out_of_the_average_and_named(data, tmp_path):
    job = xcal_job(data, tmp_path / "served")

    def tamper(r, k, report, tensors):
        if (r, k) == (1, 1):
            report["ledger"]["epsilon"] = 0.0

    serve(Grid(replace(job, out_dir=tmp_path / "nodes"), tamper), job, 10.0, 10.0)
    privacy = json.loads((tmp_path / "served" / "privacy.json").read_text())
    [refused] = privacy["extra"]["refused_updates"]
    assert (refused["round"], refused["client"]) == (2, 1)
    assert refused["reason"].startswith("ledger.epsilon: claims 0.0")
    assert REFUSED_REASON in privacy["reasons"]
    assert privacy["extra"]["client_rounds"] == [2, 2]  # the refused round still counts
    rounds = json.loads((tmp_path / "served" / "federation.json").read_text())["rounds"]
    assert rounds[1]["received"] == [0, 1] and list(rounds[1]["refused"]) == ["1"]

    # the model is the simulation's with that update left out
    fed = prepare(replace(job, out_dir=tmp_path / "sim"))[1]
    from dpmed.xcal.federation import TrainState, train_round

    history = TrainState.start(fed.net)
    for r in range(2):

        def local(sampled, global_state, r=r):
            updates = [
                fed.clients[k].train_round(fed.net, fed.wrapped, global_state) for k in sampled
            ]
            return updates if r == 0 else updates[:1]

        train_round(fed, history, road_due=False, remote=local)
    served = weights(tmp_path / "served")
    assert all(torch.equal(served[k], v) for k, v in fed.net.state_dict().items())


def test_a_run_failing_in_round_2_leaves_a_record_of_round_1(data, tmp_path):
    job = xcal_job(data, tmp_path / "served")

    during: list[dict] = []  # the record while round 2 runs

    def tamper(r, k, report, tensors):
        if (r, k) == (1, 0):
            during.append(json.loads((tmp_path / "served" / "privacy.json").read_text()))
            report["privacy"]["rounds"] = 0
        if (r, k) == (1, 1):
            tensors[first_float(tensors)].view(-1)[0] = math.nan

    with pytest.raises(FederationError, match="round 2: no acceptable update") as error:
        serve(Grid(replace(job, out_dir=tmp_path / "nodes"), tamper), job, 10.0, 10.0)
    assert "client 0: privacy.rounds: claims 0, the server observed 2" in str(error.value)
    assert "client 1: tensor" in str(error.value) and "non-finite" in str(error.value)

    [running] = during
    assert running["extra"]["deployment"] == {"status": "running", "released_rounds": [1]}
    assert running["extra"]["client_rounds"] == [1, 1]
    assert math.isclose(running["epsilon"], static_epsilon(30, 1), rel_tol=1e-9)

    privacy = json.loads((tmp_path / "served" / "privacy.json").read_text())
    deployment = privacy["extra"]["deployment"]
    assert deployment["status"] == "failed" and deployment["released_rounds"] == [1]
    assert deployment["stopped"] == f"FederationError: {error.value}"
    assert privacy["extra"]["client_rounds"] == [2, 2]  # both updates of round 2 arrived
    assert privacy["extra"]["client_steps"] == [4, 4]  # the steps the server charged
    assert privacy["extra"]["client_sample_rates"] == [0.5, 0.5]  # 17 … 32 images each
    assert math.isclose(privacy["epsilon"], static_epsilon(30, 2), rel_tol=1e-9)
    federation = json.loads((tmp_path / "served" / "federation.json").read_text())
    assert federation["status"] == "failed" and federation["released_rounds"] == [1]
    assert federation["stopped"] == deployment["stopped"]
    assert [r["round"] for r in federation["rounds"]] == [1, 2]
    assert not (tmp_path / "served" / "model.pt").exists()


@pytest.mark.parametrize("n_samples", [0, -(10**9), 10**9, 1e9, "30", True, None])
def test_the_roll_call_refuses_an_absurd_sample_count_by_node(data, tmp_path, n_samples):
    job = xcal_job(data, tmp_path)

    def tamper(r, k, report, tensors):
        if k == 1:
            report["n_samples"] = n_samples

    grid = Grid(job, tamper)
    with pytest.raises(FederationError, match=f"SuperNode {NODE + 1}.*n_samples"):
        roll_call(grid, job, grid.fed.model_arguments, 5.0)


def test_a_refused_roll_call_leaves_a_federation_record_and_no_privacy_claim(data, tmp_path):
    job = xcal_job(data, tmp_path / "served")

    def tamper(r, k, report, tensors):
        if k == 0:
            report["n_samples"] = 0

    with pytest.raises(FederationError, match=f"SuperNode {NODE}'s roll call refused"):
        serve(Grid(replace(job, out_dir=tmp_path / "nodes"), tamper), job, 10.0, 10.0)
    federation = json.loads((tmp_path / "served" / "federation.json").read_text())
    assert federation["status"] == "failed" and federation["released_rounds"] == []
    assert "n_samples: 0 is not a count" in federation["stopped"]
    assert not (tmp_path / "served" / "privacy.json").exists()  # no client trained
