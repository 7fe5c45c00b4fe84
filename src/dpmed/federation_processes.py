"""Start, watch and stop the processes of a local federation (an FL engine's server and
client daemons on 127.0.0.1), by pid, on free ports.

Used by the deployment launchers of the federated studies (Flower's SuperLink/SuperNodes,
OpenFL's aggregator/collaborators). Each process runs in its own session (process group) with
stdout and stderr going to one log file, so a stop reaches the children it spawned and a
failure can be read back from the log.

The launchers' one skeleton (`dpmed fl-openfl`, `dpmed fl-flower`): `launcher_parser` (the
options both share, with the same defaults), `launching` (one launch per folder: its lock,
SIGTERM/SIGINT as `Terminated`, the previous launch's files cleared, the record
processes.json, every process group stopped at the end) and `finish` (the exit status: 0, 1 on
a failure, 128 + the signal's number). Each engine supplies its own options and its `deploy`,
which starts its processes (`start`, `LaunchRecord.started`), waits for them (`wait_for_port`,
`wait_for_line`, `watch`, `check_alive`) and relays their progress (`NewLines`).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmed.io import write_json


class FederationProcessError(RuntimeError):
    """A federation process died or did not become ready in time (the message cites its log)."""


class Terminated(FederationProcessError):
    """The launcher received SIGTERM or SIGINT (names the signal)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"the launcher received {signal.Signals(signum).name}")


@contextmanager
def terminated_by_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise `Terminated` in the main thread (so the
    launcher's `finally` stops every process group it started with `stop` and writes its
    record); the previous handlers are restored on exit. Only the first signal raises: a
    repeated one (a second Ctrl-C, a scheduler's follow-up SIGTERM) must not interrupt that
    cleanup, which `stop` bounds by its SIGKILL grace."""
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if not received:
            received.append(signum)
            raise Terminated(signum)

    handled = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, handler) for sig in handled}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass
class Process:
    """A started daemon: its name in the run's record, the Popen handle, its log and ports."""

    name: str
    cmd: list[str]
    log_path: Path
    popen: subprocess.Popen
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        """The last `chars` characters of the log (what to show when it failed)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-chars:]


_HELD: set[Path] = set()  # the folders whose launch lock this process holds


@contextmanager
def launch_lock(folder: Path) -> Iterator[None]:
    """Hold `folder/.lock` (an exclusive `flock`, released when the process ends) for the
    block, so two launches never write one output folder (nested blocks of one process share
    it); raise `FederationProcessError` naming the folder at once when another launch holds
    it. The lock file stays: deleting it would let a second launch lock a new one."""
    folder = Path(folder).resolve()
    if folder in _HELD:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise FederationProcessError(
                f"{folder} is in use by another launch (pid {handle.read().strip() or '?'} "
                f"holds {folder / '.lock'}); one launch per output folder, nothing was changed"
            ) from None
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        _HELD.add(folder)
        try:
            yield
        finally:
            _HELD.discard(folder)
            fcntl.flock(handle, fcntl.LOCK_UN)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (bind port 0, read it back).

    The port is released before the caller binds it, so another program could take it in
    between; on a test machine that window is small enough to accept.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(
    name: str,
    cmd: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    ports: Mapping[str, int] | None = None,
) -> Process:
    """Start `cmd` in a new session, stdout+stderr appended to `log_path`; `env` is added to
    the current environment; `ports` (role -> port) is only recorded."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    return Process(name, list(cmd), log_path, popen, dict(ports or {}))


def check_alive(procs: Iterable[Process]) -> None:
    """Raise FederationProcessError naming the first of `procs` that exited, with its log tail."""
    for proc in procs:
        if not proc.alive():
            raise FederationProcessError(
                f"{proc.name} (pid {proc.pid}) exited with code {proc.popen.returncode}; "
                f"log {proc.log_path}:\n{proc.log_tail()}"
            )


def wait_for_port(
    port: int, timeout: float = 60.0, procs: Iterable[Process] = (), host: str = "127.0.0.1"
) -> None:
    """Return once a TCP connect to host:port succeeds; raise if `timeout` s pass first or one
    of `procs` (the processes that should open it) exits."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while True:
        check_alive(procs)
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise FederationProcessError(f"nothing listens on {host}:{port} after {timeout} s")
        time.sleep(0.1)


def wait_for_line(proc: Process, pattern: str, timeout: float = 60.0) -> re.Match:
    """Return the first match of regex `pattern` in the process's log, waiting up to `timeout`
    s; raise if the process exits without writing it."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while True:
        text = proc.log_path.read_text(errors="replace") if proc.log_path.exists() else ""
        match = regex.search(text)
        if match:
            return match
        if not proc.alive():
            check_alive([proc])
        if time.monotonic() > deadline:
            raise FederationProcessError(
                f"{proc.name} wrote no line matching {pattern!r} in {timeout} s; "
                f"log {proc.log_path}:\n{proc.log_tail()}"
            )
        time.sleep(0.1)


class NewLines:
    """The complete lines a file gains between calls of `read`, each returned once: what a
    launcher relays from a file a federation process is writing (its log, its round records).
    A line still being written is left for the next call."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0  # bytes already returned

    def read(self) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        return data[:end].decode(errors="replace").splitlines()


def watch(done: Callable[[], bool], deadline: float, what: str, poll: float = 0.2) -> None:
    """Call `done` every `poll` s until it returns True; raise FederationProcessError naming
    `what` once `time.monotonic()` passes `deadline` (the launch's --timeout)."""
    while not done():
        if time.monotonic() > deadline:
            raise FederationProcessError(f"{what} did not end before the launch's timeout")
        time.sleep(poll)


def _signal_group(proc: Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the session started for it: pgid == its pid
    except ProcessLookupError:
        pass


def group_alive(proc: Process) -> bool:
    """Whether any process of `proc`'s process group still exists (a zombie counts)."""
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(procs: Iterable[Process], timeout: float) -> None:
    """Reap the leaders and wait until their groups are empty (orphaned children are reaped
    by init, asynchronously); raise if a group outlives `timeout` s."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        if proc.alive():
            proc.popen.wait()
        while group_alive(proc):
            if time.monotonic() > deadline:
                raise FederationProcessError(f"process group {proc.pid} ({proc.name}) survives")
            time.sleep(0.05)


def stop(procs: Iterable[Process], grace: float = 5.0) -> None:
    """Stop each process and its children: SIGTERM to its process group, wait up to `grace` s,
    then SIGKILL to whatever is left, and wait until every group is gone. Safe on processes
    already gone."""
    procs = list(procs)
    for proc in procs:
        if proc.alive():
            _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)  # children may outlive a leader that exited
    _wait_gone(procs, grace)


def kill(proc: Process) -> None:
    """SIGKILL one process group at once (a crash, as a test simulates one); returns when the
    group is gone."""
    _signal_group(proc, signal.SIGKILL)
    _wait_gone([proc], 10.0)


def process_table(procs: Iterable[Process]) -> list[dict]:
    """The run's record of its processes: name, pid, ports, command line, log, exit code."""
    return [
        {
            "name": p.name,
            "pid": p.pid,
            "ports": dict(p.ports),
            "command": " ".join(p.cmd),
            "log": str(p.log_path),
            "returncode": p.popen.poll(),
        }
        for p in procs
    ]


@dataclass
class LaunchRecord:
    """processes.json of a launch: its jobs (their output folders), each job's status
    ("starting", "running", the engine's final status, or "stopped"), what stopped the launch
    (`error`, None if nothing), the wall time in s and every process started. `write` replaces
    the file atomically."""

    path: Path
    jobs: list[str]
    processes: list[Process] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)
    error: str | None = None

    def __post_init__(self) -> None:
        self.status = ["starting"] * len(self.jobs)

    def write(self) -> dict[str, Any]:
        record = {
            "jobs": self.jobs,
            "status": self.status,
            "error": self.error,
            "seconds": time.perf_counter() - self.start,
            "processes": process_table(self.processes),
        }
        write_json(self.path, record)
        return record

    def started(self, proc: Process) -> Process:
        """Record a process as it starts (the record rewritten): a signal's stop reaches it."""
        self.processes.append(proc)
        self.write()
        return proc

    def stopped(self, exc: BaseException) -> None:
        """Record what stopped the launch (the first cause); jobs not finished become
        "stopped"."""
        self.error = self.error or str(exc) or type(exc).__name__
        self.status = ["stopped" if s in ("starting", "running") else s for s in self.status]

    def close(self) -> dict[str, Any]:
        """Stop every process started (again: a signal may have cut an engine's own stop
        short), then write the final record and return it. A first SIGTERM/SIGINT arriving
        during the stop is recorded, the stop finished, and `Terminated` raised after the
        write (`terminated_by_signals` raises only once)."""
        try:
            stop(self.processes)
        except Terminated as exc:
            self.stopped(exc)
            stop(self.processes)
            raise
        finally:
            final = self.write()
        return final


@contextmanager
def launching(work: Path, jobs: Sequence[str]) -> Iterator[LaunchRecord]:
    """One launch in the folder `work`: hold its lock (a second launch stops before touching
    it), turn SIGTERM/SIGINT into `Terminated`, remove what a previous launch left in `work`
    (all but the lock) and keep its record `work`/processes.json for
    `jobs`: written at once, the exception that ends the block recorded, and on exit every
    process stopped and the final record written."""
    work = Path(work).resolve()
    with launch_lock(work), terminated_by_signals():
        for stale in work.iterdir():
            if stale.name == ".lock":
                continue
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        record = LaunchRecord(work / "processes.json", list(jobs))
        try:
            record.write()
            yield record
        except BaseException as exc:
            record.stopped(exc)
            raise
        finally:
            record.close()


def _seconds(text: str) -> float:
    value = float(text)
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def launcher_parser(prog: str, doc: str, config: Path) -> argparse.ArgumentParser:
    """A launcher's parser with the options both share (same defaults): its description the
    first paragraph of `doc`, the rest the epilog; `config` the default config file."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--config", nargs="+", type=Path, default=[config],
                        help=f"config files, merged in order (default {config.name})")  # fmt: skip
    parser.add_argument("--processed", type=Path, help="processed dataset folder (default: the "
                        "config's synthetic data, generated under OUT/data)")  # fmt: skip
    parser.add_argument(
        "--seeded",
        action="store_true",
        help="draw the DP noise and client generators from the job seeds, as the simulation "
        "does: reproducible, for tests only (default: OS entropy, as a deployment must)",
    )
    parser.add_argument("--timeout", type=_seconds, default=3600.0,
                        help="seconds before the launch is stopped (3600)")  # fmt: skip
    parser.add_argument("--round-timeout", type=_seconds, default=600.0,
                        help="seconds a round may take before it is stopped (600)")  # fmt: skip
    return parser


def finish(work: Path, launch: Callable[[], Mapping[str, Any]]) -> int:
    """Run `launch` (returning its final record) and say how it ended: the processes and the
    jobs' status on stdout, exit status 0; else the error on stderr, exit status 1, or 128 +
    the signal's number when the launcher was signalled."""
    try:
        record = launch()
    except FederationProcessError as exc:  # processes stopped, processes.json written
        print(f"federation failed: {exc}; record in {work}", file=sys.stderr)
        return 128 + exc.signum if isinstance(exc, Terminated) else 1
    for proc in record["processes"]:
        print(f"{proc['name']:<24} pid {proc['pid']:<8} ports {proc['ports']}  {proc['command']}")
    print(f"{record['status']} in {record['seconds']:.1f} s; record in {work}")
    return 0
