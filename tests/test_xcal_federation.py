"""The xcal federation shared by the job and the Flower apps: seeds from the seed block without
touching the global RNG, one `next_sigma` per step, the Flower server's ledger views as plain
accounts, and the Flower apps importing nothing of the job module."""

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import XCAL_PARAMS, xcal_processed

from dpmed.config.grid import common_seed
from dpmed.runtime import JobContext
from dpmed.xcal import federation, methods
from dpmed.xcal.client import Client, ClientAccount
from dpmed.xcal.flower.server_app import ledger_view

SRC = Path(__file__).resolve().parents[1] / "src" / "dpmed" / "xcal"
PARAMS = {**XCAL_PARAMS, "rounds": 3, "clients_per_round": 2}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("xcal_federation"), [60, 10, 12])


def _job(data: Path, out: Path, method: str = "xcal", eps: str = "4", model: str = "resnet18"):
    wc = {"dataset": "bloodmnist", "model": model, "method": method, "shift": "iid",
          "clients": "3", "eps": eps, "seed": "0"}  # fmt: skip
    return JobContext(data, out, wc, PARAMS, seed=11, device="cpu", threads=1)


def test_building_a_federation_leaves_the_global_rng_alone(data, tmp_path):
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    federation.initial_network(_job(data, tmp_path).wildcards, _arguments(), torch.device("cpu"))
    assert torch.equal(torch.random.get_rng_state(), before)


def _arguments() -> dict:
    return {"in_channels": 3, "n_classes": 8, "image_size": 28, "width_scale": 0.25}


def test_init_partition_and_schedule_come_from_the_seed_blocks_common_seeds(data, tmp_path):
    """Recomputed from `common_seed` by hand: the initial weights (torch seeded with the `init`
    seed), the partition seed and every round's m of K (NumPy's choice at `schedule-r`)."""
    job = _job(data, tmp_path)
    wc = job.wildcards
    net, _ = federation.initial_network(wc, _arguments(), torch.device("cpu"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(common_seed("xcal", wc, "init"))
        from dpmed.models import build_model

        expected = build_model(wc["model"], **_arguments())
    for name, tensor in expected.state_dict().items():
        assert torch.equal(net.state_dict()[name], tensor), name
    assert federation.partition_seed(wc) == common_seed("xcal", wc, "partition")
    by_hand = [
        sorted(np.random.default_rng(common_seed("xcal", wc, f"schedule-{r}"))
               .choice(3, 2, replace=False).tolist())
        for r in range(PARAMS["rounds"])
    ]  # fmt: skip
    assert federation.client_schedule(job) == by_hand


def test_methods_and_eps_of_a_block_share_init_partition_and_schedule(data, tmp_path):
    jobs = [_job(data, tmp_path / m, m, e) for m, e in [("xcal", "4"), ("static", "2")]]
    feds = [federation.prepare(job)[1] for job in jobs]
    first, second = feds
    for name, tensor in first.net.state_dict().items():
        assert torch.equal(second.net.state_dict()[name], tensor), name
    assert first.schedule == second.schedule
    for a, b in zip(first.clients, second.clients, strict=True):
        assert torch.equal(a.y, b.y)


class Counting:
    """Wraps a method and counts its `next_sigma` calls; stops after `limit` when given."""

    def __init__(self, method: methods.Method, limit: int | None = None) -> None:
        self.method, self.limit, self.calls = method, limit, 0

    def __getattr__(self, name: str):
        return getattr(self.method, name)

    def next_sigma(self, account, signal):
        self.calls += 1
        if self.limit is not None and self.calls > self.limit:
            return None
        return self.method.next_sigma(account, signal)


@pytest.mark.parametrize(("method", "limit"), itertools.product(["static", "xcal"], [None, 1]))
def test_a_client_asks_its_method_once_per_step_and_stops_on_none(data, tmp_path, method, limit):
    fed = federation.prepare(_job(data, tmp_path, method))[1]
    client: Client = fed.clients[0]
    counting = Counting(fed.method, limit)
    client.account.method = counting
    state = {k: v.detach().clone() for k, v in fed.net.state_dict().items()}
    client.train_round(fed.net, fed.wrapped, state)
    steps = client.account.stats.steps
    planned = PARAMS["local_epochs"] * client.account.steps_per_epoch
    assert planned > 1 and steps == (planned if limit is None else limit)
    assert counting.calls == steps + (limit is not None)  # the call that said None
    assert len(client.account.stats.sigmas) == steps
    if method == "xcal":
        assert len(client.account.stats.signals) == steps


def test_the_flower_servers_view_is_an_account_with_the_clients_epsilon(data, tmp_path):
    job = _job(data, tmp_path)
    fed = federation.prepare(job)[1]
    client = fed.clients[1]
    view = ledger_view(job, 1, client.account.n, fed)
    assert type(view) is ClientAccount
    assert (view.q, view.total_steps) == (client.account.q, client.account.total_steps)
    assert view.state.sigma_ref == client.account.state.sigma_ref
    assert view.epsilon() == client.account.epsilon()


def test_the_flower_apps_import_nothing_from_the_job_module():
    for path in sorted((SRC / "flower").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {
            node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        } | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}  # fmt: skip
        assert "dpmed.xcal.run" not in imported, path.name
