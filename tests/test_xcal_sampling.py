"""The server samples m of the K clients per round (paper 001 App. A): uniform sets of the right
size, one schedule per cell, FedAvg over the sampled clients only, and each client's privacy
spent over exactly the rounds it trained in."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from conftest import XCAL_PARAMS, xcal_processed
from opacus.accountants import RDPAccountant
from torch import nn

from dpmed.privacy.accounting import noise_multiplier
from dpmed.runtime import JobContext
from dpmed.xcal import federation as xcal_fed
from dpmed.xcal.client import ClientUpdate
from dpmed.xcal.federation import TrainState, client_schedule, sampled_clients
from dpmed.xcal.run import run

TARGET = 3.0


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("xcal_sampling"), [90, 10, 12])


def _job(data: Path, out: Path, method: str, params: dict, clients: int = 3) -> JobContext:
    wc = {"dataset": "bloodmnist", "model": "resnet18", "method": method, "shift": "iid",
          "clients": str(clients), "eps": f"{TARGET:g}", "seed": "0"}  # fmt: skip
    return JobContext(data, out, wc, params, seed=0, device="cpu", threads=1)


def test_sampled_sets_have_size_m_and_every_set_is_equally_likely():
    """K = 5, m = 2 over 5000 seeds: each draw is 2 distinct sorted indices of 0..4, each client
    is in 40 % of the draws and each of the 10 pairs in 10 % (binomial sd ≤ 0.7 %)."""
    draws = [tuple(sampled_clients(5, 2, seed)) for seed in range(5000)]
    assert all(len(set(d)) == 2 and list(d) == sorted(d) and set(d) <= set(range(5)) for d in draws)
    per_client = Counter(k for d in draws for k in d)
    for k in range(5):
        assert per_client[k] / len(draws) == pytest.approx(0.4, abs=0.025)
    pairs = Counter(draws)
    assert set(pairs) == set(itertools.combinations(range(5), 2))
    for count in pairs.values():
        assert count / len(draws) == pytest.approx(0.1, abs=0.025)
    assert sampled_clients(3, 10, 7) == [0, 1, 2]  # m ≥ K: every client


def test_schedule_is_one_per_cell_and_round(data, tmp_path):
    """Every method of a cell sees the same schedule (paired comparisons); rounds differ."""
    params = {**XCAL_PARAMS, "rounds": 40, "clients_per_round": 2}
    static = client_schedule(_job(data, tmp_path, "static", params, clients=6))
    xcal = client_schedule(_job(data, tmp_path, "xcal", params, clients=6))
    assert static == xcal and len(static) == 40
    assert all(len(s) == 2 for s in static) and len({tuple(s) for s in static}) > 5


class _Stub:
    """A client that returns a fixed update and records being asked to train."""

    def __init__(self, value: float, n: int) -> None:
        self.value, self.n, self.calls = value, n, 0

    def train_round(self, net, wrapped, global_state) -> ClientUpdate:
        self.calls += 1
        tensors = {"weight": torch.full((1, 2), self.value), "bias": torch.full((1,), -self.value)}
        return ClientUpdate(tensors, self.n, {})


def test_fedavg_averages_only_the_sampled_clients():
    net = nn.Linear(2, 1)
    stubs = [_Stub(1.0, 10), _Stub(2.0, 30), _Stub(5.0, 20), _Stub(7.0, 40)]
    evaluation = SimpleNamespace(scores=lambda: {"f1": 0.0, "accuracy": 0.0})
    fed = xcal_fed.Federation(
        net, None, stubs, [], evaluation, SimpleNamespace(dp=False), {}, [[1, 2], [0, 3]]
    )
    history = TrainState({k: v.clone() for k, v in net.state_dict().items()})
    xcal_fed.train_round(fed, history, road_due=False)
    expected = (30 * 2.0 + 20 * 5.0) / (30 + 20)  # round 1 samples clients 1 and 2
    torch.testing.assert_close(history.global_state["weight"], torch.full((1, 2), expected))
    torch.testing.assert_close(history.global_state["bias"], torch.full((1,), -expected))
    assert [s.calls for s in stubs] == [0, 1, 1, 0]
    xcal_fed.train_round(fed, history, road_due=False)
    expected = (10 * 1.0 + 40 * 7.0) / (10 + 40)
    torch.testing.assert_close(net.weight.detach(), torch.full((1, 2), expected))
    assert [s.calls for s in stubs] == [1, 1, 1, 1]


def _opacus_epsilon(sigma: float, q: float, steps: int) -> float:
    if steps == 0:
        return 0.0
    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(XCAL_PARAMS["delta"])


def test_a_client_spends_only_in_the_rounds_it_is_sampled_in(data, tmp_path):
    """Static DP-SGD, K = 5, m = 2, 3 rounds (this cell samples clients 0…4 in 0, 1, 2, 1, 2
    rounds): each client's rounds are a brute-force count of the schedule, its steps rounds × S,
    its σ calibrated to exactly those steps and its ε that of (σ, q, steps) by Opacus'
    accountant; the run's ε is the largest client's."""
    params = {**XCAL_PARAMS, "rounds": 3, "clients_per_round": 2}
    job = _job(data, tmp_path, "static", params, clients=5)
    schedule = client_schedule(job)
    run(job)
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    extra = privacy["extra"]
    assert privacy["guarantee"] == "dp" and extra["clients_per_round"] == 2
    assert sorted(extra["client_rounds"]) == [0, 1, 1, 2, 2]
    sizes = json.loads((tmp_path / "metrics.json").read_text())["client_sizes"]
    for k, n in enumerate(sizes):
        rounds = sum(1 for sampled in schedule if k in sampled)
        s = -(-n // params["batch_size"])  # steps per local epoch
        assert extra["client_rounds"][k] == rounds
        assert extra["client_steps"][k] == rounds * params["local_epochs"] * s
        if rounds:
            sigma = noise_multiplier(TARGET, params["delta"], 1 / s, rounds * s)
            assert extra["client_sigma_ref"][k] == pytest.approx(sigma)
        expected = _opacus_epsilon(extra["client_sigma_ref"][k], 1 / s, rounds * s)
        assert extra["client_epsilon"][k] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert privacy["epsilon"] == pytest.approx(max(extra["client_epsilon"]))
    assert privacy["epsilon"] == pytest.approx(TARGET, rel=1e-3)  # σ met the target exactly
    trained = [k for k in range(5) if extra["client_rounds"][k]]
    assert privacy["noise_multipliers"] == sorted({extra["client_sigma_ref"][k] for k in trained})
    # rounds.csv: round r's ε is the largest client's spend over the rounds played so far
    eps = pd.read_csv(tmp_path / "rounds.csv")["epsilon"].tolist()
    for r in range(3):
        played = Counter(k for sampled in schedule[: r + 1] for k in sampled)
        per_client = []
        for k, n in enumerate(sizes):
            s = -(-n // params["batch_size"])
            per_client.append(_opacus_epsilon(extra["client_sigma_ref"][k], 1 / s, played[k] * s))
        assert eps[r] == pytest.approx(max(per_client), rel=1e-9)


def test_xcal_bounds_count_only_the_rounds_a_client_trained(data, tmp_path):
    """XCal-FL, K = 5, m = 2, 3 rounds: no client steps past its sampled rounds, its proven
    bound stays within the target, and the one that sat out every round has spent nothing."""
    params = {**XCAL_PARAMS, "rounds": 3, "clients_per_round": 2}
    job = _job(data, tmp_path, "xcal", params, clients=5)
    schedule = client_schedule(job)
    run(job)
    extra = json.loads((tmp_path / "privacy.json").read_text())["extra"]
    sizes = json.loads((tmp_path / "metrics.json").read_text())["client_sizes"]
    for k, n in enumerate(sizes):
        rounds = sum(1 for sampled in schedule if k in sampled)
        assert extra["client_rounds"][k] == rounds
        assert extra["client_steps"][k] <= rounds * -(-n // params["batch_size"])
        assert 0 <= extra["client_epsilon"][k] <= TARGET + 1e-9
        if rounds == 0:
            assert extra["client_epsilon"][k] == 0.0 and extra["client_steps"][k] == 0
    assert sum(extra["client_rounds"]) == 3 * 2 and 0 in extra["client_rounds"]
