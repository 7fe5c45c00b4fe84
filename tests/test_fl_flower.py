"""XCal-FL as a Flower app in Flower's deployment engine (per job a SuperLink and three
SuperNodes on 127.0.0.1 with the sites' policies for that job, `flwr run`) against dpmed's
in-process simulation of the same job: the same final model and privacy.json; and a SuperNode
killed mid-round: the round completes without its client, whose missing update privacy.json
names, and the model is the simulation's with that update left out. Every process is started
and stopped by pid (process groups checked gone)."""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import FLOWER_PARAMS, FLOWER_WILDCARDS, xcal_processed

from dpmed import federation_processes as fp
from dpmed.config.grid import job_seed
from dpmed.config.wildcards import parse_eps
from dpmed.models import load_model
from dpmed.runtime import JobContext
from dpmed.xcal.federation import TrainState, client_schedule, prepare, train_round
from dpmed.xcal.privacy import privacy_record
from dpmed.xcal.run import run

pytest.importorskip("flwr")
from dpmed.xcal.flower.certs import make_node_key  # noqa: E402
from dpmed.xcal.flower.deploy import (  # noqa: E402
    BIN,
    FEDERATION,
    deploy,
    flwr,
    local_federation,
    site_configs,
)
from dpmed.xcal.flower.policy import SitePolicy  # noqa: E402
from dpmed.xcal.flower.runconfig import run_path, write_run_config  # noqa: E402
from dpmed.xcal.flower.server_app import FAILED_REASON  # noqa: E402

pytestmark = pytest.mark.fl

# Two rounds, two of the three clients each (the schedule's m-of-K sampling).
PARAMS = FLOWER_PARAMS
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("flower_data"), [90, 10, 20])


def xcal_job(data: Path, out: Path, method: str, eps: str) -> JobContext:
    """The cell's job writing to out/<run path> (the run config's run folder)."""
    wc = {**FLOWER_WILDCARDS, "method": method, "eps": eps}
    return JobContext(data, out / run_path(wc), wc, PARAMS, job_seed("xcal", wc), "cpu", 1)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_model(path / "model.pt").state_dict()


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def assert_stopped(processes: list[dict]) -> None:
    """Every process (and its process group: SuperExec, ClientApps) is gone."""
    for proc in processes:
        assert proc["returncode"] is not None, proc["name"]
        with pytest.raises(ProcessLookupError):
            os.killpg(proc["pid"], 0)


METHODS = [("xcal", "2"), ("nondp", "inf")]


@pytest.fixture(scope="module")
def deployed(data, tmp_path_factory) -> tuple[dict[str, JobContext], dict]:
    """Both methods' jobs run at once, each on its own local federation, the folder given
    relative to the current one as `make fl-flower` gives it (the ServerApp runs in a folder of
    its own), with no virtualenv on PATH: the launcher finds Flower's commands, and those the
    SuperLink and SuperNodes start by name, beside its own Python."""
    root = tmp_path_factory.mktemp("flower_runs")
    jobs = {method: xcal_job(data, root / method, method, eps) for method, eps in METHODS}
    work = Path(os.path.relpath(root / "flower"))
    printed = io.StringIO()
    path = os.environ["PATH"]
    os.environ["PATH"] = "/usr/bin:/bin"
    try:
        with contextlib.redirect_stdout(printed):
            record = deploy(list(jobs.values()), work, 120, seeded=True, timeout=500)
    finally:
        os.environ["PATH"] = path
    return jobs, {**record, "printed": printed.getvalue().splitlines(), "work": work.resolve()}


def test_each_job_runs_on_a_superlink_and_three_supernodes_stopped_by_pid(deployed):
    jobs, record = deployed
    names = [p["name"] for p in record["processes"]]
    daemons = ["superlink", "supernode-0", "supernode-1", "supernode-2"]
    assert names == [f"job-{i}/{d}" for i in (1, 2) for d in daemons] + [
        "job-1/flwr-run-1",
        "job-2/flwr-run-1",
    ]
    ports = [port for p in record["processes"] for port in p["ports"].values()]
    assert len(ports) == len(set(ports)) == 12
    assert record["status"] == ["finished:completed"] * 2
    assert record["error"] is None
    assert_stopped(record["processes"])
    commands = {p["name"]: p["command"] for p in record["processes"]}
    for i, job in enumerate(jobs.values(), 1):  # each site's policy admits its job only
        for k in range(3):
            site = record["work"] / f"job-{i}" / f"site-{k}"
            assert SitePolicy.read(site / "policy.json") == SitePolicy.for_job(job)
            command = commands[f"job-{i}/supernode-{k}"]
            assert f"policy='{site / 'policy.json'}' state-dir='{site / 'state'}'" in command


def test_the_launcher_relays_one_progress_line_per_round_of_each_run(deployed):
    jobs, record = deployed
    for method, job in jobs.items():
        label = f"[flower xcal bloodmnist/resnet18/{method}/iid]"
        steps = [ln.split()[3] for ln in record["printed"] if ln.startswith(label)]
        assert steps == ["1/2", "2/2"], record["printed"]
        final = json.loads((Path(job.out_dir) / "privacy.json").read_text())["epsilon"]
        last = next(ln for ln in reversed(record["printed"]) if ln.startswith(label))
        assert ("eps=inf" if final is None else f"eps={final:.4g}") in last.split()


@pytest.mark.parametrize(("method", "eps"), METHODS)
def test_the_deployed_run_equals_the_in_process_simulation(deployed, tmp_path, method, eps):
    jobs, _ = deployed
    job = jobs[method]
    run(replace(job, out_dir=tmp_path))
    difference = max_difference(weights(tmp_path), weights(Path(job.out_dir)))
    print(f"{method}: final model max |deployed - simulated| = {difference:.3g}")
    assert difference <= TOLERANCE
    assert weights(tmp_path).keys() == weights(Path(job.out_dir)).keys()
    for name in ("privacy.json", "road.json"):
        assert json.loads((Path(job.out_dir) / name).read_text()) == json.loads(
            (tmp_path / name).read_text()
        ), name
    deployed_rows = pd.read_csv(Path(job.out_dir) / "rounds.csv").drop(columns="seconds")
    simulated_rows = pd.read_csv(tmp_path / "rounds.csv").drop(columns="seconds")
    pd.testing.assert_frame_equal(deployed_rows, simulated_rows)
    initial = prepare(replace(job, out_dir=tmp_path / "init"))[1].net.state_dict()
    assert max_difference(initial, weights(tmp_path)) > 1e-3  # the clients did train


def simulate_without(job: JobContext, dropped: set[tuple[int, int]]) -> tuple[dict, dict]:
    """The in-process run of `job` with the updates of (round, client) in `dropped` left out
    (0-based rounds): its final weights and privacy.json record."""
    fed = prepare(job)[1]
    history = TrainState.start(fed.net)
    for r in range(job.params["rounds"]):

        def local(sampled, global_state, r=r):
            kept = [fed.clients[k] for k in sampled if (r, k) not in dropped]
            return [c.train_round(fed.net, fed.wrapped, global_state) for c in kept]

        train_round(fed, history, road_due=False, remote=local)
    eps = parse_eps(job.wildcards["eps"])
    record = privacy_record(fed.accounts, fed.method, eps, job.params)
    path = Path(job.out_dir) / "expected-privacy.json"
    record.write(path, job.wildcards["dataset"])
    return fed.net.state_dict(), json.loads(path.read_text())


def test_a_supernode_killed_mid_round_is_left_out_and_named(data, tmp_path):
    job = xcal_job(data, tmp_path, "xcal", "2")
    run_dir = Path(job.out_dir)
    victim = client_schedule(job)[1][0]  # a client sampled in round 2
    work = tmp_path / "flower"
    timeouts = {"round-timeout": 40, "connect-timeout": 60}
    run_config = write_run_config(tmp_path / "run-config.toml", job, **timeouts)
    with local_federation(work, site_configs(job, work, seeded=True)) as federation:
        flwr_run = federation.start_run(run_config)
        fp.wait_for_line(federation.superlink, r"round 2: sent to clients", timeout=300)
        fp.kill(federation.supernodes[victim])
        flwr_run.popen.wait(timeout=300)
        status = federation.run_status(flwr_run)
    assert status == "finished:completed"
    assert_stopped(fp.process_table(federation.processes()))

    privacy = json.loads((run_dir / "privacy.json").read_text())
    failed = privacy["extra"].pop("failed_updates")
    assert [(f["round"], f["client"]) for f in failed] == [(2, victim)]
    assert privacy["reasons"].pop() == FAILED_REASON
    rounds = json.loads((run_dir / "federation.json").read_text())["rounds"]
    assert victim in rounds[1]["sampled"] and victim not in rounds[1]["received"]

    expected_weights, expected_privacy = simulate_without(
        replace(job, out_dir=tmp_path / "sim"), {(1, victim)}
    )
    difference = max_difference(expected_weights, weights(run_dir))
    print(f"killed client {victim}: max |deployed - simulated without it| = {difference:.3g}")
    assert difference <= TOLERANCE
    assert privacy == expected_privacy
    rounds_done = privacy["extra"]["client_rounds"]
    assert rounds_done[victim] == sum(victim in s for s in client_schedule(job)) - 1
    assert np.isfinite(privacy["epsilon"])


def test_every_federation_runs_tls_and_admits_registered_supernodes_only(deployed):
    """The launcher's commands: the SuperLink serves TLS with SuperNode authentication, each
    SuperNode trusts the federation's CA and signs in with its own key; nothing is insecure."""
    _, record = deployed
    for proc in record["processes"]:
        assert "--insecure" not in proc["command"], proc["name"]
    commands = {p["name"]: p["command"] for p in record["processes"]}
    for i in (1, 2):
        tls = record["work"] / f"job-{i}" / "certificates"
        superlink = commands[f"job-{i}/superlink"]
        for flag, path in [("--ssl-ca-certfile", "ca.crt"), ("--ssl-certfile", "server.pem"),
                           ("--ssl-keyfile", "server.key")]:  # fmt: skip
            assert f"{flag} {tls / path}" in superlink
        assert "--enable-supernode-auth" in superlink
        for k in range(3):
            key = record["work"] / f"job-{i}" / "keys" / f"supernode-{k}"
            node = commands[f"job-{i}/supernode-{k}"]
            assert f"--root-certificates {tls / 'ca.crt'}" in node
            assert f"--auth-supernode-private-key {key}" in node


def test_an_unregistered_supernode_is_refused(data, tmp_path):
    """A SuperNode with a valid key the SuperLink never registered cannot join: the SuperLink
    refuses it and lists only the registered node."""
    job = xcal_job(data, tmp_path, "xcal", "2")
    work = tmp_path / "flower"
    with local_federation(work, site_configs(job, work, seeded=True)[:1]) as federation:
        rogue_key = make_node_key(tmp_path / "rogue").with_suffix("")
        cmd = [
            str(BIN / "flower-supernode"),
            "--superlink", f"127.0.0.1:{federation.superlink.ports['fleet']}",
            "--root-certificates", str(work / "certificates" / "ca.crt"),
            "--auth-supernode-private-key", str(rogue_key),
            "--clientappio-api-address", f"127.0.0.1:{fp.free_port()}",
        ]  # fmt: skip
        rogue = fp.start("rogue", cmd, tmp_path / "rogue.log", federation.env)
        try:
            fp.wait_for_line(rogue, "No SuperNode found with the given public key", 60)
            listed = flwr(federation.env, "supernode", "list", str(federation.app), FEDERATION)
        finally:
            fp.stop([rogue])
    nodes = json.loads(listed.stdout)["nodes"]
    assert [node["status"] for node in nodes] == ["online"], nodes
