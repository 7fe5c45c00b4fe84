"""Common random numbers in xcal: two runs of one seed block that differ only in the method
(static DP-FL and XCal-FL at the same ε) or in ε start from the same weights and see the same
Poisson batches at every client, while their Gaussian noise comes from generators of their own
job seeds. Each run goes through the real runner with its workflow job seed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import XCAL_PARAMS, xcal_processed

from dpmed.config.grid import job_seed
from dpmed.runtime import JobContext
from dpmed.xcal.client import Client
from dpmed.xcal.run import run

PARAMS = dict(XCAL_PARAMS) | {"rounds": 1}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("xcal_crn"), [90, 10, 20])


def _wc(method: str, eps: str) -> dict[str, str]:
    return {"dataset": "bloodmnist", "model": "resnet18", "method": method, "shift": "iid",
            "clients": "3", "eps": eps, "seed": "0"}  # fmt: skip


def _observe(data: Path, out: Path, method: str, eps: str, monkeypatch) -> dict:
    """The initial global weights, and per client every gradient step's batch and the state of
    its noise generator before its first step, of one run."""
    seen: dict = {"initial": None, "batches": {}, "noise": {}}
    train_round, dp_step = Client.train_round, Client.dp_step

    def record_round(self, net, wrapped, global_state):
        if seen["initial"] is None:
            seen["initial"] = {k: v.detach().clone() for k, v in global_state.items()}
        return train_round(self, net, wrapped, global_state)

    def record_step(self, model, optimizer, xb, yb, noise_std):
        seen["noise"].setdefault(self.account.index, self.noise.get_state().clone())
        seen["batches"].setdefault(self.account.index, []).append((xb.clone(), yb.clone()))
        return dp_step(self, model, optimizer, xb, yb, noise_std)

    with monkeypatch.context() as patch:
        patch.setattr(Client, "train_round", record_round)
        patch.setattr(Client, "dp_step", record_step)
        wc = _wc(method, eps)
        run(JobContext(data, out, wc, PARAMS, job_seed("xcal", wc), device="cpu", threads=1))
    return seen


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory) -> dict[tuple[str, str], dict]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        return {
            (method, eps): _observe(data, tmp_path_factory.mktemp(method), method, eps, monkeypatch)
            for method, eps in (("static", "3"), ("xcal", "3"), ("static", "8"))
        }


def _same_batch(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]):
    return a[0].shape == b[0].shape and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("other", [("xcal", "3"), ("static", "8")])
def test_a_seed_block_shares_weights_and_batches_not_noise(runs, other):
    static, run_b = runs[("static", "3")], runs[other]
    assert static["initial"].keys() == run_b["initial"].keys()
    assert all(torch.equal(static["initial"][k], run_b["initial"][k]) for k in static["initial"])
    assert sorted(static["batches"]) == sorted(run_b["batches"]) == [0, 1, 2]
    for k, batches in static["batches"].items():
        assert _same_batch(batches[0], run_b["batches"][k][0]), f"client {k}, first step"
        # the signal's samples have their own stream, so every later step pairs too
        steps = min(len(batches), len(run_b["batches"][k]))
        assert all(_same_batch(batches[i], run_b["batches"][k][i]) for i in range(steps))
        assert not torch.equal(static["noise"][k], run_b["noise"][k]), f"client {k}: same noise"
