"""Run xcal jobs on local Flower federations as sites run them: per job a SuperLink serving TLS
with SuperNode authentication and one SuperNode per client on 127.0.0.1, each registered with
its own key, and one `flwr run` of the app in deploy/flower on the job's run config.

<out>/flower is the launch's folder (`dpmed.federation_processes`: one launch per folder,
processes.json with each job's run status, SIGTERM/SIGINT, exit status); per job, job-<i>/
under it holds the processes' logs, Flower's home folder (FLWR_HOME), the credentials
(`dpmed.xcal.flower.certs`: certificates/, keys/), the run config (run-config.toml,
`dpmed.xcal.flower.runconfig`) and one site per SuperNode, whose policy admits that one job
(site-<k>/policy.json, ledger in site-<k>/state). Each job's run folder <out>/<run>/ holds what
the ServerApp writes (rounds.csv, road.json, gradcam.npz, privacy.json, model.pt,
federation.json). The SuperNodes deal the processed train split to the clients as the
in-process run does (`split=dpmed`) and seed them from the node's OS entropy (`seeds=secret`),
or with `--seeded` from the job (`seeds=job`, reproducing a simulation: for tests only).

Default: the smoke config's XCal-FL and static DP-FL cells at ε = 5 on its synthetic
BloodMNIST, generated under <out>/data (`make fl-flower`). A chosen cell on processed data:

    dpmed fl-flower --config config/smoke.yaml \\
        --run results/xcal/bloodmnist/resnet18/xcal/iid/c3/eps5/seed0 \\
        --processed data/processed/bloodmnist --out results/fl/flower
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmed import federation_processes as fp
from dpmed.install import workflow_file
from dpmed.runtime import JobContext
from dpmed.xcal.flower import PROGRESS_LABEL
from dpmed.xcal.flower.certs import make_credentials
from dpmed.xcal.flower.runconfig import SMOKE_CONFIG, SMOKE_RUNS, write_run_config, xcal_jobs
from dpmed.xcal.outputs import RUN_FILES

APP_DIR = workflow_file("deploy/flower")
# flower-superlink, flower-supernode, flwr; the daemons start flower-superexec, flwr-serverapp
# and flwr-clientapp by name, so BIN also leads their PATH
BIN = Path(sys.executable).parent
FEDERATION = "local-tls"  # the federation the launcher adds to its copy of the app
READY_TIMEOUT = 60.0
PROGRESS_PREFIX = f"[{PROGRESS_LABEL} "
PROGRESS_POLL = 1.0  # s between reads of the runs' streams


@dataclass
class LocalFederation:
    """A running SuperLink and its SuperNodes (`local_federation`) and the copy of the app
    (`app`) whose federation `FEDERATION` reaches it; `on_start` is called with each process
    started for it (a run too)."""

    work: Path
    env: dict[str, str]
    control_address: str
    app: Path
    superlink: fp.Process
    supernodes: list[fp.Process]
    on_start: Callable[[fp.Process], None] = lambda proc: None
    label: str = ""
    runs: list[fp.Process] = field(default_factory=list)

    def processes(self) -> list[fp.Process]:
        return [self.superlink, *self.supernodes, *self.runs]

    def start_run(self, run_config: Path) -> fp.Process:
        """Start `flwr run --stream` of the xcal app on the run config file `run_config` (it
        ends with the run)."""
        cmd = [
            str(BIN / "flwr"), "run", str(self.app), FEDERATION, "--stream",
            "--run-config", str(Path(run_config).resolve()),
        ]  # fmt: skip
        name = f"flwr-run-{len(self.runs) + 1}"
        proc = fp.start(self.label + name, cmd, self.work / f"{name}.log", self.env, cwd=self.work)
        self.runs.append(proc)
        self.on_start(proc)
        return proc

    def run_status(self, run: fp.Process) -> str:
        """The Flower status of the run `run` started, e.g. "finished:completed"; raises
        FederationProcessError naming the SuperLink when it cannot tell (SuperLink gone,
        unreadable `flwr ls` output)."""
        run_id = fp.wait_for_line(run, r"started run (\d+)", READY_TIMEOUT).group(1)
        result = flwr(self.env, "ls", str(self.app), FEDERATION, "--run-id", run_id)
        try:
            return str(json.loads(result.stdout)["runs"][0]["status"])
        except (ValueError, LookupError, TypeError):
            superlink = self.superlink
            state = "running" if superlink.alive() else f"exited ({superlink.popen.returncode})"
            raise fp.FederationProcessError(
                f"no status of run {run_id} from {superlink.name} (pid {superlink.pid}, "
                f"{state}) at {self.control_address}: flwr ls said "
                f"{(result.stdout + result.stderr)[-500:]!r}; log {superlink.log_path}:\n"
                f"{superlink.log_tail()}"
            ) from None


def flwr(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`flwr ARGS --format json` (its JSON answer in stdout)."""
    cmd = [str(BIN / "flwr"), *args, "--format", "json"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def app_copy(work: Path, control: int, ca_certificate: Path) -> Path:
    """The Flower app (deploy/flower) copied into `work`/app with the federation `FEDERATION`
    (the SuperLink's Control API on 127.0.0.1:`control`, TLS with `ca_certificate`) added:
    `flwr supernode register` takes no federation overrides, and `flwr run` writes a .flwr
    folder beside the app, which an installed dpmed's own folder may not allow."""
    app = work / "app"
    shutil.copytree(APP_DIR, app, ignore=shutil.ignore_patterns(".flwr"))
    with open(app / "pyproject.toml", "a") as pyproject:
        pyproject.write(
            f'\n[tool.flwr.federations.{FEDERATION}]\naddress = "127.0.0.1:{control}"\n'
            f'root-certificates = "{ca_certificate}"\n'
        )
    return app


def register(env: dict[str, str], app: Path, public_key: Path) -> int:
    """Register the SuperNode key `public_key` with the SuperLink `app`'s `FEDERATION` reaches
    (`flwr supernode register`); its node id, or FederationProcessError with Flower's answer."""
    result = flwr(env, "supernode", "register", str(public_key), str(app), FEDERATION)
    try:
        return int(json.loads(result.stdout)["node-id"])
    except (ValueError, LookupError, TypeError):
        raise fp.FederationProcessError(
            f"flwr supernode register {public_key} failed: {(result.stdout + result.stderr)[-500:]}"
        ) from None


@contextmanager
def local_federation(
    work: Path,
    node_configs: Sequence[str],
    env: dict[str, str] | None = None,
    label: str = "",
    on_start: Callable[[fp.Process], None] = lambda proc: None,
) -> Iterator[LocalFederation]:
    """Start a SuperLink (TLS, SuperNode authentication) on free ports of 127.0.0.1 and one
    SuperNode per entry of `node_configs` (its --node-config), each registered with its own key
    (`certs.make_credentials` in `work`); wait until each listens, and stop them all by pid on
    exit. Every path the processes get is absolute: they run in `work`, the ServerApp in a
    folder of its own. Process names start with `label`; `on_start` is called with each process
    as it starts (a launcher's record sees it before the federation is up)."""
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    full_env = {
        "FLWR_HOME": str(work / "home"),
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        **(env or {}),
    }
    node_keys = make_credentials(work, len(node_configs))
    tls = work / "certificates"
    procs: list[fp.Process] = []  # stopped on exit, runs included

    def begin(proc: fp.Process) -> None:
        procs.append(proc)
        on_start(proc)

    try:
        fleet, serverappio, control = fp.free_port(), fp.free_port(), fp.free_port()
        local = "127.0.0.1:"
        cmd = [str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(tls / "ca.crt"),
               "--ssl-certfile", str(tls / "server.pem"), "--ssl-keyfile", str(tls / "server.key"),
               "--enable-supernode-auth", "--serverappio-api-address", f"{local}{serverappio}",
               "--fleet-api-address", f"{local}{fleet}", "--control-api-address",
               f"{local}{control}", "--storage-dir", str(work / "superlink-storage")]  # fmt: skip
        ports = {"fleet": fleet, "serverappio": serverappio, "control": control}
        superlink = fp.start(f"{label}superlink", cmd, work / "superlink.log", full_env, work,
                             ports)  # fmt: skip
        begin(superlink)
        for port in (fleet, serverappio, control):
            fp.wait_for_port(port, READY_TIMEOUT, [superlink])
        app = app_copy(work, control, tls / "ca.crt")
        supernodes = []
        for k, (node_config, public_key) in enumerate(zip(node_configs, node_keys, strict=True)):
            register(full_env, app, public_key)
            appio = fp.free_port()
            cmd = [str(BIN / "flower-supernode"), "--root-certificates", str(tls / "ca.crt"),
                   "--auth-supernode-private-key", str(public_key.with_suffix("")),
                   "--superlink", f"{local}{fleet}", "--clientappio-api-address",
                   f"{local}{appio}", "--node-config", node_config]  # fmt: skip
            node = fp.start(f"{label}supernode-{k}", cmd, work / f"supernode-{k}.log", full_env,
                            work, {"clientappio": appio})  # fmt: skip
            begin(node)
            supernodes.append(node)
        for node in supernodes:
            fp.wait_for_port(node.ports["clientappio"], READY_TIMEOUT, [node])
        yield LocalFederation(work, full_env, f"{local}{control}", app, superlink, supernodes,
                              begin, label)  # fmt: skip
    finally:
        fp.stop(procs)


def site_configs(job: JobContext, work: Path, seeded: bool = False) -> list[str]:
    """The --node-configs of `job`'s K sites (`client_app.NodeSettings`): each its client
    number, the job's processed data dealt as the in-process run deals them, its seeds (the
    job's when `seeded`, else the node's OS entropy), site-<k>/policy.json under `work` (written
    here: the policy admitting `job` only) and its ledger folder site-<k>/state."""
    from dpmed.xcal.flower.policy import SitePolicy

    n_clients, seeds = int(job.wildcards["clients"]), "job" if seeded else "secret"
    configs = []
    for k in range(n_clients):
        site = (Path(work) / f"site-{k}").resolve()
        SitePolicy.for_job(job).write(site / "policy.json")
        configs.append(
            f"partition-id={k} num-partitions={n_clients} "
            f"data-dir='{Path(job.processed_dir).resolve()}' split='dpmed' seeds='{seeds}' "
            f"threads=1 policy='{site / 'policy.json'}' state-dir='{site / 'state'}'"
        )
    return configs


def deploy(
    jobs: Sequence[JobContext],
    work: Path,
    round_timeout: float = 600.0,
    seeded: bool = False,
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """Run `jobs` at once, each on its own local federation (a SuperLink and K SuperNodes with
    the sites' policies for that job), logs and homes under `work`/job-<i>/, in a launch of
    `work` (`fp.launching`); each job's outputs go to its out_dir. Returns the final
    processes.json; raises FederationProcessError when a SuperLink dies or a run does not
    finish completed, and `fp.Terminated` on SIGTERM/SIGINT, every process stopped and the
    record written first."""
    work = Path(work).resolve()  # the run configs' paths travel to the ServerApp's own folder
    with fp.launching(work, [str(job.out_dir) for job in jobs]) as record:
        for job in jobs:  # a run that fails early leaves no older record beside it
            for name in (*RUN_FILES, "federation.json"):
                (Path(job.out_dir) / name).unlink(missing_ok=True)
        with ExitStack() as stack:
            federations = [
                stack.enter_context(
                    local_federation(
                        work / f"job-{i}",
                        site_configs(job, work / f"job-{i}", seeded),
                        label=f"job-{i}/",
                        on_start=record.started,
                    )
                )
                for i, job in enumerate(jobs, 1)
            ]
            follow_runs(jobs, federations, record, round_timeout, timeout)
        if any(status != "finished:completed" for status in record.status):
            raise fp.FederationProcessError(f"Flower runs ended {record.status}; logs in {work}")
    return json.loads(record.path.read_text())


def follow_runs(
    jobs: Sequence[JobContext],
    federations: Sequence[LocalFederation],
    record: fp.LaunchRecord,
    round_timeout: float,
    timeout: float,
) -> None:
    """Start each job's `flwr run` on its federation, relay their progress lines, and set each
    run's final status in `record` (rewritten at each change) as it ends; raise
    FederationProcessError naming the SuperLink when one dies, or at `timeout` s."""
    runs = []
    timeouts = {"round-timeout": round_timeout, "connect-timeout": READY_TIMEOUT}
    for i, (job, federation) in enumerate(zip(jobs, federations, strict=True)):
        run_config = write_run_config(federation.work / "run-config.toml", job, **timeouts)
        runs.append(federation.start_run(run_config))
        record.status[i] = "running"
    record.write()
    logs = [fp.NewLines(run.log_path) for run in runs]
    pending = set(range(len(runs)))

    def ended() -> bool:
        fp.check_alive(federations[i].superlink for i in pending)
        for i in sorted(i for i in pending if not runs[i].alive()):
            relay_progress(logs)
            record.status[i] = federations[i].run_status(runs[i])
            pending.discard(i)
            record.write()
        relay_progress(logs)
        return not pending

    fp.watch(ended, time.monotonic() + timeout, "flwr run", PROGRESS_POLL)


def relay_progress(logs: Sequence[fp.NewLines]) -> None:
    """Print the progress lines the ServerApps wrote to their `flwr run` streams since the
    last call (one per round: scores, ε spent so far, elapsed, ETA; `dpmed.runtime.Progress`)."""
    for log in logs:
        for line in log.read():
            if line.startswith(PROGRESS_PREFIX):
                print(line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = fp.launcher_parser("dpmed fl-flower", __doc__, SMOKE_CONFIG)
    parser.add_argument(
        "--run", nargs="+", default=SMOKE_RUNS,
        help="run folder path(s) of xcal jobs of one dataset, each on its own federation "
        "(default: the smoke config's XCal-FL and static DP-FL cells at eps 5)",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="torch device of the server (cpu)")
    args = parser.parse_args(argv)
    jobs = xcal_jobs(args.config, args.run, args.processed, args.out, args.device)
    work = args.out / "flower"
    launch = lambda: deploy(jobs, work, args.round_timeout, args.seeded, args.timeout)  # noqa: E731
    return fp.finish(work, launch)


if __name__ == "__main__":
    sys.exit(main())
