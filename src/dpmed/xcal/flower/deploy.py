"""Run xcal jobs on a local Flower federation: a SuperLink and one SuperNode per client on
127.0.0.1 (insecure: a test federation), one `flwr run` per job of the app in deploy/flower.

Every process is started by pid on free ports (`dpmed.federation_processes`) with its own log
under <out>/flower/, Flower's home folder (FLWR_HOME) is <out>/flower/home, and everything is
stopped by pid when the runs end or fail. Each job's run folder <out>/<run>/ then holds what
the ServerApp writes (rounds.csv, road.json, gradcam.npz, privacy.json, model.pt,
federation.json), and <out>/flower/processes.json each process's name, pid, ports, command and
log, the runs' status and the wall time. The SuperNodes deal the processed train split to the
clients as the in-process run does (`split=dpmed`) and seed them from the job (`seeds=job`,
reproducing a simulation) unless `--secret-seeds`.

Default: the smoke config's XCal-FL and static DP-FL cells at ε = 5 on its synthetic
BloodMNIST, generated under <out>/data (`make fl-flower`). A chosen cell on processed data:

    python -m dpmed.xcal.flower.deploy --config config/smoke.yaml \\
        --run results/xcal/bloodmnist/resnet18/xcal/iid/c3/eps5/seed0 \\
        --processed data/processed/bloodmnist --out flower-run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmed import federation_processes as fp
from dpmed.io import write_json
from dpmed.runtime import JobContext
from dpmed.xcal.flower import PROGRESS_LABEL

REPO = Path(__file__).resolve().parents[4]
APP_DIR = REPO / "deploy" / "flower"
SMOKE_CONFIG = REPO / "config" / "smoke.yaml"
SMOKE_RUNS = [
    f"results/xcal/bloodmnist/resnet18/{method}/iid/c3/eps5/seed0" for method in ("xcal", "static")
]
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode, flwr, flwr-serverapp
FEDERATION = "local"
READY_TIMEOUT = 60.0
PROGRESS_PREFIX = f"[{PROGRESS_LABEL} "
PROGRESS_POLL = 1.0  # s between reads of the runs' streams


@dataclass
class LocalFederation:
    """A running SuperLink and its SuperNodes (`local_federation`)."""

    work: Path
    env: dict[str, str]
    control_address: str
    superlink: fp.Process
    supernodes: list[fp.Process]
    runs: list[fp.Process] = field(default_factory=list)

    def processes(self) -> list[fp.Process]:
        return [self.superlink, *self.supernodes, *self.runs]

    def start_run(
        self, job_file: Path, round_timeout: float, connect_timeout: float, app: Path = APP_DIR
    ) -> fp.Process:
        """Start `flwr run --stream` of the xcal app on `job_file` (it ends with the run)."""
        config = f"job='{job_file}' round-timeout={round_timeout} connect-timeout={connect_timeout}"
        cmd = [
            str(BIN / "flwr"), "run", str(app), FEDERATION, "--stream",
            "--run-config", config,
            "--federation-config", f"address='{self.control_address}' insecure=true",
        ]  # fmt: skip
        name = f"flwr-run-{len(self.runs) + 1}"
        proc = fp.start(name, cmd, self.work / f"{name}.log", self.env, cwd=self.work)
        self.runs.append(proc)
        return proc

    def run_status(self, run: fp.Process, app: Path = APP_DIR) -> str:
        """The Flower status of the run `run` started, e.g. "finished:completed"."""
        run_id = fp.wait_for_line(run, r"started run (\d+)", READY_TIMEOUT).group(1)
        cmd = [
            str(BIN / "flwr"), "ls", str(app), FEDERATION, "--run-id", run_id, "--format", "json",
            "--federation-config", f"address='{self.control_address}' insecure=true",
        ]  # fmt: skip
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        runs = json.loads(result.stdout)["runs"]
        return str(runs[0]["status"])


@contextmanager
def local_federation(
    work: Path, node_configs: Sequence[str], env: dict[str, str] | None = None
) -> Iterator[LocalFederation]:
    """Start a SuperLink and one SuperNode per entry of `node_configs` (its --node-config) on
    free ports of 127.0.0.1, wait until each listens, and stop them all by pid on exit. Every
    path the processes get is absolute: they run in `work`, the ServerApp in a folder of its own."""
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    full_env = {
        "FLWR_HOME": str(work / "home"),
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        **(env or {}),
    }
    procs: list[fp.Process] = []
    try:
        fleet, serverappio, control = fp.free_port(), fp.free_port(), fp.free_port()
        superlink = fp.start(
            "superlink",
            [
                str(BIN / "flower-superlink"),
                "--insecure",
                "--serverappio-api-address",
                f"127.0.0.1:{serverappio}",
                "--fleet-api-address",
                f"127.0.0.1:{fleet}",
                "--control-api-address",
                f"127.0.0.1:{control}",
                "--storage-dir",
                str(work / "superlink-storage"),
            ],  # fmt: skip
            work / "superlink.log",
            full_env,
            cwd=work,
            ports={"fleet": fleet, "serverappio": serverappio, "control": control},
        )
        procs.append(superlink)
        for port in (fleet, serverappio, control):
            fp.wait_for_port(port, READY_TIMEOUT, [superlink])
        supernodes = []
        for k, node_config in enumerate(node_configs):
            appio = fp.free_port()
            node = fp.start(
                f"supernode-{k}",
                [
                    str(BIN / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{fleet}",
                    "--clientappio-api-address",
                    f"127.0.0.1:{appio}",
                    "--node-config",
                    node_config,
                ],  # fmt: skip
                work / f"supernode-{k}.log",
                full_env,
                cwd=work,
                ports={"clientappio": appio},
            )
            procs.append(node)
            supernodes.append(node)
        for node in supernodes:
            fp.wait_for_port(node.ports["clientappio"], READY_TIMEOUT, [node])
        federation = LocalFederation(work, full_env, f"127.0.0.1:{control}", superlink, supernodes)
        try:
            yield federation
        finally:
            procs.extend(federation.runs)
    finally:
        fp.stop(procs)


def node_config(k: int, n_clients: int, data_dir: Path, secret_seeds: bool = False) -> str:
    """The --node-config of client k's SuperNode in a local federation (`client_app`)."""
    seeds = "secret" if secret_seeds else "job"
    return (
        f"partition-id={k} num-partitions={n_clients} data-dir='{Path(data_dir).resolve()}' "
        f"split='dpmed' seeds='{seeds}' threads=1"
    )


def deploy(
    jobs: Sequence[JobContext],
    work: Path,
    round_timeout: float = 600.0,
    secret_seeds: bool = False,
    run_timeout: float = 3600.0,
) -> dict[str, Any]:
    """Run `jobs` (one processed folder and client count K) at once on one local federation of
    K SuperNodes, Flower logs and home under `work`; each job's outputs go to its out_dir.
    Writes and returns processes.json's content (in `work`); raises FederationProcessError
    when a run does not finish completed."""
    from dpmed.xcal.flower.jobfile import write_job

    if len({(Path(j.processed_dir), j.wildcards["clients"]) for j in jobs}) != 1:
        raise ValueError("the jobs of one federation share their processed data and clients")
    work = Path(work).resolve()  # the job files' paths travel to the ServerApp's own folder
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    n_clients, data_dir = int(jobs[0].wildcards["clients"]), jobs[0].processed_dir
    configs = [node_config(k, n_clients, data_dir, secret_seeds) for k in range(n_clients)]
    start = time.perf_counter()
    with local_federation(work, configs) as federation:
        runs = []
        for i, job in enumerate(jobs):
            write_job(work / f"job-{i + 1}.json", job)
            runs.append(
                federation.start_run(work / f"job-{i + 1}.json", round_timeout, READY_TIMEOUT)
            )
        logs = [fp.NewLines(run.log_path) for run in runs]
        deadline = time.monotonic() + run_timeout
        while any(run.alive() for run in runs):
            if time.monotonic() > deadline:
                raise fp.FederationProcessError(f"flwr run exceeded {run_timeout} s")
            relay_progress(logs)
            time.sleep(PROGRESS_POLL)
        relay_progress(logs)
        statuses = [federation.run_status(run) for run in runs]
    record = {  # after the stop: every return code is set
        "jobs": [str(job.out_dir) for job in jobs],
        "status": statuses,
        "seconds": time.perf_counter() - start,
        "processes": fp.process_table(federation.processes()),
    }
    write_json(work / "processes.json", record)
    if any(status != "finished:completed" for status in statuses):
        raise fp.FederationProcessError(
            f"Flower runs ended {statuses}; logs in {work}:\n{federation.superlink.log_tail()}"
        )
    return record


def relay_progress(logs: Sequence[fp.NewLines]) -> None:
    """Print the progress lines the ServerApps wrote to their `flwr run` streams since the
    last call (one per round: scores, ε spent so far, elapsed, ETA; `dpmed.runtime.Progress`)."""
    for log in logs:
        for line in log.read():
            if line.startswith(PROGRESS_PREFIX):
                print(line, flush=True)


def xcal_jobs(
    config_files: Sequence[Path],
    runs: Sequence[str],
    processed: Path | None,
    out: Path,
    device: str,
) -> list[JobContext]:
    """The JobContexts the workflow would give the xcal jobs whose run folders are `runs`, each
    writing to out/<run>. Without `processed`, the config's synthetic data of the runs' dataset
    are generated under out/data (as the data stage would)."""
    from dpmed.config.checks import check_config, load_configs
    from dpmed.config.grid import job_seed, wildcards_from_path

    config = load_configs(config_files)
    grid = check_config(config, REPO / "config" / "schema.yaml", config_files)
    wildcards = [wildcards_from_path("xcal", run) for run in runs]
    if processed is None:
        processed = synthetic_data(config, {wc["dataset"] for wc in wildcards}, out / "data")
    return [
        JobContext(
            processed,
            out / run,
            wc,
            grid.params("xcal", wc),
            job_seed("xcal", wc),
            device=device,
            threads=1,
        )  # fmt: skip
        for run, wc in zip(runs, wildcards, strict=True)
    ]


def synthetic_data(config: dict[str, Any], datasets: set[str], root: Path) -> Path:
    """Generate and process the config's synthetic data of the one dataset in `datasets`."""
    from dpmed.data.stage import synthetic_processed

    if len(datasets) != 1:
        raise SystemExit(f"the runs of one federation read one dataset, not {sorted(datasets)}")
    (dataset,) = datasets
    return synthetic_processed(dataset, config["data"][dataset], root)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m dpmed.xcal.flower.deploy",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", nargs="+", type=Path, default=[SMOKE_CONFIG],
        help="config file(s), merged in order (default config/smoke.yaml)",
    )  # fmt: skip
    parser.add_argument(
        "--run", nargs="+", default=SMOKE_RUNS,
        help="run folder path(s) of xcal jobs, one dataset and client count (default: the "
        "smoke config's XCal-FL and static DP-FL cells at eps 5)",
    )  # fmt: skip
    parser.add_argument(
        "--processed", type=Path,
        help="processed dataset folder (default: generate the config's synthetic data)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, required=True, help="output folder: out/<run>/ per job, out/flower/"
    )
    parser.add_argument("--device", default="cpu", help="torch device of the server (cpu)")
    parser.add_argument("--round-timeout", type=float, default=600.0, help="s per round")
    parser.add_argument(
        "--secret-seeds", action="store_true", help="clients seed from OS entropy (no replay)"
    )
    args = parser.parse_args(argv)
    jobs = xcal_jobs(args.config, args.run, args.processed, args.out, args.device)
    record = deploy(jobs, args.out / "flower", args.round_timeout, args.secret_seeds)
    for proc in record["processes"]:
        print(f"{proc['name']:<14} pid {proc['pid']:<8} ports {proc['ports']}  {proc['command']}")
    print(f"{record['status']} in {record['seconds']:.1f} s; outputs in {args.out}")


if __name__ == "__main__":
    main()
