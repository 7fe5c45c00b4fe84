"""The Flower launcher fails cleanly: SIGTERM stops every process it started and leaves a
record naming the signal (and privacy.json the released round); processes.json exists while
the run runs; a dead SuperLink is an error naming it (not a KeyError from `flwr ls`); the
federation listens on 127.0.0.1 only.

The launcher runs as a subprocess (a driver calling `deploy` on one tiny 2-round job), as
Snakemake or SLURM would run it, and is signalled or has its SuperLink killed after the
progress line of round 1."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import FLOWER_PARAMS, FLOWER_WILDCARDS, xcal_processed

from dpmed import federation_processes as fp
from dpmed.config.grid import job_seed
from dpmed.runtime import JobContext

pytest.importorskip("flwr")
from dpmed.xcal.flower.deploy import LocalFederation, app_copy  # noqa: E402
from dpmed.xcal.flower.runconfig import run_path, write_run_config  # noqa: E402

PARAMS = FLOWER_PARAMS
DRIVER = (
    "import sys; from pathlib import Path; from dpmed.xcal.flower.deploy import deploy; "
    "import tomllib; from flwr.common.config import flatten_dict; "
    "from dpmed.xcal.flower.runconfig import job_from_run_config; "
    "job = job_from_run_config(flatten_dict(tomllib.loads(Path(sys.argv[1]).read_text()))); "
    "deploy([job], Path(sys.argv[2]), round_timeout=60, seeded=True, timeout=300)"
)
ROUND_1 = r"(?m)^\[flower xcal \S+\] 1/2 "
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}
SEED = job_seed("xcal", FLOWER_WILDCARDS)


def run_dir(root: Path) -> Path:
    """The test job's run folder under `root`."""
    return root / run_path(FLOWER_WILDCARDS)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("flower_fault_data"), [90, 10, 20])


def launch(data: Path, root: Path) -> fp.Process:
    """The launcher on one XCal-FL job (ε = 2, 3 clients, 2 rounds), in its own session."""
    job = JobContext(data, run_dir(root), FLOWER_WILDCARDS, PARAMS, SEED, "cpu", 1)
    write_run_config(root / "run-config.toml", job)
    cmd = [sys.executable, "-c", DRIVER, str(root / "run-config.toml"), str(root / "flower")]
    return fp.start("launcher", cmd, root / "launcher.log")


def record(root: Path) -> dict:
    return json.loads((root / "flower" / "processes.json").read_text())


def released(root: Path) -> list[int]:
    """The rounds the run's privacy.json says were released (the run did not complete)."""
    privacy = json.loads((run_dir(root) / "privacy.json").read_text())
    return privacy["extra"]["deployment"]["released_rounds"]


def assert_gone(processes: list[dict]) -> None:
    for proc in processes:
        with pytest.raises(ProcessLookupError):
            os.killpg(proc["pid"], 0)


def cleanup(launcher: fp.Process, root: Path) -> None:
    """Whatever a failed test left: the launcher's group and the groups it recorded."""
    fp.stop([launcher], grace=1.0)
    if (root / "flower" / "processes.json").exists():
        for proc in record(root)["processes"]:
            try:
                os.killpg(proc["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def bound_addresses(pgids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket and bound UDP socket of the processes in
    the process groups `pgids`, read from the kernel's socket tables (psutil)."""
    addresses = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) not in pgids:
                continue
            sockets = proc.net_connections("inet")
        except (psutil.Error, ProcessLookupError):
            continue  # gone meanwhile, or not ours
        addresses += [
            (s.laddr.ip, s.laddr.port)
            for s in sockets
            if s.status == psutil.CONN_LISTEN or s.type == socket.SOCK_DGRAM
        ]
    return addresses


@pytest.mark.fl
def test_sigterm_stops_every_process_and_the_record_names_it(data, tmp_path):
    launcher = launch(data, tmp_path)
    try:
        fp.wait_for_line(launcher, ROUND_1, timeout=300)
        running = record(tmp_path)  # (b) the record exists while the run runs
        assert running["status"] == ["running"] and running["error"] is None
        assert all(p["returncode"] is None for p in running["processes"])
        names = [p["name"] for p in running["processes"]]
        assert names[:4] == ["job-1/superlink"] + [f"job-1/supernode-{k}" for k in range(3)]

        # (d) every socket the federation's processes (and their children) bound is loopback
        pgids = {p["pid"] for p in running["processes"]} | {launcher.pid}
        bound = bound_addresses(pgids)
        assert {ip for ip, _ in bound} <= LOOPBACK, bound
        recorded = {port for p in running["processes"] for port in p["ports"].values()}
        assert recorded <= {port for _, port in bound}  # the scan saw the daemons' ports

        sent = time.monotonic()
        os.kill(launcher.pid, signal.SIGTERM)
        launcher.popen.wait(timeout=60)
        assert time.monotonic() - sent < 20
    finally:
        cleanup(launcher, tmp_path)
    log = launcher.log_path.read_text()
    assert launcher.popen.returncode != 0, log
    final = record(tmp_path)
    assert "SIGTERM" in final["error"] and final["status"] == ["stopped"]
    assert [p["name"] for p in final["processes"]] == names
    assert all(p["returncode"] is not None for p in final["processes"])
    assert_gone(final["processes"])
    assert released(tmp_path) == [1]


@pytest.mark.fl
def test_a_dead_superlink_is_an_error_naming_it(data, tmp_path):
    launcher = launch(data, tmp_path)
    try:
        fp.wait_for_line(launcher, ROUND_1, timeout=300)
        pids = {p["name"]: p["pid"] for p in record(tmp_path)["processes"]}
        os.killpg(pids["job-1/supernode-0"], signal.SIGKILL)
        os.killpg(pids["job-1/superlink"], signal.SIGKILL)
        killed = time.monotonic()
        launcher.popen.wait(timeout=60)
        assert time.monotonic() - killed < 20
    finally:
        cleanup(launcher, tmp_path)
    log = launcher.log_path.read_text()
    assert launcher.popen.returncode != 0, log
    assert "KeyError" not in log
    assert re.search(r"FederationProcessError: job-1/superlink \(pid \d+\) exited", log), log
    final = record(tmp_path)
    assert final["error"].startswith("job-1/superlink") and final["status"] == ["stopped"]
    assert_gone(final["processes"])
    assert released(tmp_path) == [1]


def test_run_status_of_a_dead_superlink_names_it_and_its_log(tmp_path):
    """`flwr ls` against a SuperLink that is gone answers with an error object (no "runs"):
    the launcher raises FederationProcessError with the SuperLink's log, not KeyError."""
    superlink = fp.start(
        "superlink", ["sh", "-c", "echo fleet api failed; exit 3"], tmp_path / "superlink.log"
    )
    run = fp.start("flwr-run-1", ["sh", "-c", "echo started run 42"], tmp_path / "run.log")
    superlink.popen.wait()
    run.popen.wait()
    port = fp.free_port()
    address = f"127.0.0.1:{port}"
    app = app_copy(tmp_path, port, tmp_path / "ca.crt")
    federation = LocalFederation(tmp_path, dict(os.environ), address, app, superlink, [])
    with pytest.raises(fp.FederationProcessError, match="superlink") as caught:
        federation.run_status(run)
    message = str(caught.value)
    assert "run 42" in message and address in message
    assert "exited (3)" in message and "fleet api failed" in message


def test_a_signal_during_the_final_stop_still_stops_everything_and_is_recorded(tmp_path):
    """SIGTERM arriving while the launcher stops its processes after the runs (a daemon slow to
    exit: it ignores SIGTERM and ends after 2 s) interrupts that stop once; the stop is
    finished and the record names the signal."""
    script = "trap '' TERM; echo ready; sleep 2"
    stubborn = fp.start("job-1/superlink", ["sh", "-c", script], tmp_path / "superlink.log")
    fp.wait_for_line(stubborn, "ready", timeout=10)
    record = fp.LaunchRecord(tmp_path / "processes.json", ["run"], [stubborn])
    record.status = ["finished:completed"]
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    with pytest.raises(fp.Terminated, match="SIGTERM"), fp.terminated_by_signals():
        timer.start()
        record.close()  # the signal lands while `stop` waits for the group
    timer.join()
    final = json.loads((tmp_path / "processes.json").read_text())
    assert "SIGTERM" in final["error"] and final["status"] == ["finished:completed"]
    assert final["processes"][0]["returncode"] is not None
    assert_gone(final["processes"])


HOLDER = (
    "import sys; from pathlib import Path; from dpmed.federation_processes import launch_lock\n"
    "with launch_lock(Path(sys.argv[1])):\n"
    "    print('held', flush=True); sys.stdin.readline()\n"
)


def test_a_second_launch_on_the_same_folder_is_refused_and_changes_nothing(data, tmp_path):
    """Two launches with one output folder would delete each other's live federation: the
    second stops at once, naming the folder and the first launch's pid."""
    import subprocess

    from dpmed.xcal.flower.deploy import deploy

    work = (tmp_path / "flower").resolve()
    (work / "job-1").mkdir(parents=True)
    (work / "processes.json").write_text("{}")  # the first launch's live files
    job = JobContext(
        data, run_dir(tmp_path), FLOWER_WILDCARDS, PARAMS, seed=0, device="cpu", threads=1
    )
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(work)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert first.stdout.readline() == "held\n"
        with pytest.raises(fp.FederationProcessError, match=f"pid {first.pid} holds"):
            deploy([job], work, round_timeout=10, seeded=True, timeout=10)
        assert (work / "job-1").is_dir() and (work / "processes.json").read_text() == "{}"
        assert first.poll() is None
    finally:
        first.communicate("\n", timeout=30)
