"""Nothing a client sends the server is a function of its noise generator (issue 53).

The random-σ_t control drew u from the noise generator (MT19937) and reported σ_t =
σ_ref (1 − b + 2b·u): each σ_t gave back u·2²⁴ bits of its output, and some 800 of them at
known positions give the generator's state, hence every Gaussian noise value the client added.
Its σ_t now come from a generator of their own. The test runs the control twice with the same
seed block and different job seeds, which seed the noise only, and compares every value the
clients report to the server (`dpmed.xcal.flower.wire.report_record`: the ledger message of
`ClientUpdate`, the `privacy_state` with σ_t list, step counts and ledgers; step times left
out): all are equal, while the models differ. On the old code the reported σ_t differed.

XCal-FL proper does report σ_t that move with the noise seed, and that is allowed: each σ_t
is a function of the privatised signal only, (Σ s_i + σ_s·z)/(q·n) clipped, EMA-smoothed, and
each such release is a subsampled Gaussian charged to the signal ledger (a DP output the
accountant counts), so its σ_t are post-processing of an accounted release. A noise draw
behind it is hidden by the data-dependent sum, as the gradient noise is in the model the
client sends; the control's u hid behind nothing. The second test checks that dependence:
the reported σ_t are recomputed from the reported privatised signals alone.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from conftest import XCAL_PARAMS, xcal_processed

from dpmed.privacy.mechanisms import NOISE_SEEDED
from dpmed.runtime import JobContext
from dpmed.xcal.client import Client, ClientSeeds
from dpmed.xcal.federation import TrainState, build_federation, client_seeds, train_round
from dpmed.xcal.flower import wire
from dpmed.xcal.methods import resolve
from dpmed.xcal.signal import sigma_from_signal

WC = {"dataset": "bloodmnist", "model": "resnet18", "shift": "iid", "clients": "2", "eps": "8",
      "seed": "0"}  # fmt: skip
PARAMS = {**XCAL_PARAMS, "rounds": 2, "road_subsample": 4, "road_percentages": [0.5]}
JOB_SEEDS = (11, 12)  # two jobs of one seed block: only the noise seeds differ


@pytest.fixture(scope="module")
def processed(tmp_path_factory):
    return xcal_processed(tmp_path_factory.mktemp("noise_stream"), [48, 8, 12])


def _timeless(value: Any) -> Any:
    """`value` without its step times (wall-clock, not a function of any seed)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _run(processed, tmp_path, method: str, job_seed: int):
    """(every report the clients sent, without step times; the final global model; the
    federation) of a 2-round run of `method` under `job_seed`."""
    job = JobContext(processed, tmp_path / f"{method}-{job_seed}", {**WC, "method": method},
                     PARAMS, seed=job_seed, device="cpu", threads=1)  # fmt: skip
    fed = build_federation(job, torch.device("cpu"))
    history = TrainState.start(fed.net)
    reports: list[dict] = []

    def remote(sampled, global_state):
        clients = [fed.clients[k] for k in sampled]
        updates = [c.train_round(fed.net, fed.wrapped, global_state) for c in clients]
        for client, update in zip(clients, updates, strict=True):
            record = wire.report_record(client, update, NOISE_SEEDED)
            reports.append(_timeless(json.loads(str(record["json"]))))
        return updates

    for _ in range(PARAMS["rounds"]):
        train_round(fed, history, road_due=False, remote=remote)
    return reports, history.global_state, fed


def _last(reports: list[dict]) -> dict[int, dict]:
    """Each client's last report (its step statistics cover every round so far)."""
    return {r["client"]: r for r in reports}


def test_only_the_noise_seed_differs_between_the_two_jobs(tmp_path):
    jobs = [JobContext(tmp_path, tmp_path, {**WC, "method": "xcal-random"}, PARAMS, seed=s)
            for s in JOB_SEEDS]  # fmt: skip
    for k in range(int(WC["clients"])):
        one, two = (client_seeds(job, k) for job in jobs)
        assert one.noise != two.noise
        assert (one.sampling, one.signal, one.control) == (two.sampling, two.signal, two.control)
        assert len({one.noise, one.sampling, one.signal, one.control}) == 4


def test_no_value_the_random_control_reports_depends_on_the_noise(processed, tmp_path):
    (reports, model, _), (other, other_model, _) = (
        _run(processed, tmp_path, "xcal-random", seed) for seed in JOB_SEEDS
    )
    sigmas = [s for r in _last(reports).values() for s in r["privacy"]["stats"]["sigmas"]]
    assert len(reports) == 4 and len(set(sigmas)) == len(sigmas) > 4  # drawn, not constant
    assert reports == other  # σ_t, step counts, ledgers, ε, filter state: all the same
    assert any(not torch.equal(model[k], other_model[k]) for k in model)  # the noise differed


def test_xcal_fl_reports_sigma_t_computed_from_its_privatised_signal_only(processed, tmp_path):
    (reports, _, fed), (other, _, _) = (
        _run(processed, tmp_path, "xcal", seed) for seed in JOB_SEEDS
    )
    ema, band = PARAMS["ema"], PARAMS["band"]
    last = _last(reports)
    for client in fed.clients:
        privacy = last[client.account.index]["privacy"]
        stats = privacy["stats"]
        smoothed, proposed = 0.5, []
        for signal in stats["signals"]:
            smoothed = ema * smoothed + (1 - ema) * signal
            proposed.append(sigma_from_signal(smoothed, client.account.state.sigma_ref, band))
        # each σ_t is the proposed one, or the Rényi filter raised it (from its public ledger)
        raised = 0
        for sigma, wanted in zip(stats["sigmas"], proposed, strict=False):
            assert sigma == pytest.approx(wanted, rel=1e-12) or sigma > wanted
            raised += sigma != pytest.approx(wanted, rel=1e-12)
        assert raised == privacy["method"]["filter"]["raised"]
        charged = last[client.account.index]["ledger"]["signal"]["history"]  # [σ_s, q, steps] runs
        assert sum(steps for _, _, steps in charged) == len(stats["signals"])
    assert [r["privacy"]["stats"]["signals"] for r in reports] != [
        r["privacy"]["stats"]["signals"] for r in other
    ]


def test_the_control_schedule_is_its_seeds_and_survives_a_resume():
    """The random-σ_t control draws its T σ_t from the control seed alone when the client is
    built, so a resumed client, rebuilt from its seeds and state, steps through the same
    schedule; another control seed draws another."""
    x, y = torch.zeros((40, 1, 4, 4)), torch.zeros(40, dtype=torch.long)
    method = resolve("xcal-random", True, PARAMS["presets"])

    def client(control: int) -> Client:
        return Client(0, x, y, method, PARAMS, 8.0, ClientSeeds(1, 2, 3, control), "")

    first = client(5)
    schedule = first.account.state.schedule
    assert len(schedule) == first.account.total_steps
    resumed = client(5)
    resumed.load_state(first.state())
    assert resumed.account.state.schedule == schedule
    assert client(6).account.state.schedule != schedule
