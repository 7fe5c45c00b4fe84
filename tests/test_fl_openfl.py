"""DP-SimAgg in a real OpenFL 1.9 federation (`dpmed.fets.openfl_deploy`): an aggregator and three
collaborator processes started with `fx`, talking gRPC on 127.0.0.1.

(a) `fx workspace export` → `fx workspace import` → federation: the launcher exports the filled
workspace and runs each collaborator from its own import, whose requirements.txt pip finds
satisfied by this environment without an index. With the simulation's seeds (initial weights,
schedule, local training, server noise), the federation's final model equals the in-process
simulation `dpmed.fets.run` on the same three partitions, and so do its privacy record and every
round's validation scores (rounds.csv, progress lines); the launch's files are in OUT/openfl,
the run's in OUT/<run> (fl-flower's layout), and privacy.json's `not_covered` names exactly
both but model.pt. (b) A collaborator killed by SIGKILL mid-round:
OpenFL's aggregator would wait for it forever, so the launcher stops the federation with an
error naming it, and privacy.json accounts for the rounds released before it only. (c) SIGTERM
to the launcher after round 1: no process left, the record names round 1 and the signal; the
aggregator listens on 127.0.0.1 only. (d) A SIGSTOPped collaborator: the run stops at the round
timeout naming it. (e) An upload without a tensor: the run stops at the round's end naming the
collaborator and the tensor.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_fets_simulation import PARAMS, _processed
from test_openfl_workspace import assert_import_of

import dpmed
from dpmed.config.grid import common_seed, job_seed
from dpmed.federation_processes import FederationProcessError
from dpmed.fets import selection
from dpmed.fets.openfl_deploy import TEMPLATE, deploy, subset_folder
from dpmed.fets.run import run
from dpmed.models import build_model
from dpmed.runtime import JobContext

pytest.importorskip("openfl")
# The records' RDP eps at eps0 = 1e6 sits at the smallest order: expected here.
pytestmark = [pytest.mark.fl,
              pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")]  # fmt: skip

# eps0 = 1e6: the noise is small beside the training, so a training difference would show.
WILDCARDS = {"aggregator": "dp_simagg", "dpmode": "sound", "eps": "1000000", "seed": "0"}
FL_PARAMS = {**PARAMS, "rounds": 2, "participation": 0.67}  # 2 of 3 train each round
RUN = "results/fets/dp_simagg/sound/eps1000000/seed0"  # the run's folder in OUT
PARTITIONS = [1, 2, 3]


@pytest.fixture(scope="module")
def processed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _processed(tmp_path_factory.mktemp("fets"))


def state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def live(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


FX_STEPS = ["plan-initialize", "workspace-export", "workspace-import-1", "workspace-import-2",
            "workspace-import-3"]  # fmt: skip
FEDERATION = ["aggregator", "collaborator-1", "collaborator-2", "collaborator-3"]


def federation_names(table: list[dict]) -> list[str]:
    """The names of the federation's processes in processes.json (the fx steps before aside)."""
    return [p["name"] for p in table if p["name"] not in FX_STEPS]


def assert_imported(fed: Path) -> None:
    """Each site's import holds the exported workspace (plan, code, initial model) and its
    requirements.txt, which pip finds satisfied here without an index."""
    for site in PARTITIONS:
        assert_import_of(fed / "imports" / str(site) / "workspace", fed / "workspace")
    requirements = fed / "imports" / "1" / "workspace" / "requirements.txt"
    assert f"dpmed[fl]=={dpmed.__version__}\n" in requirements.read_text()
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
                          "-r", str(requirements)], capture_output=True, text=True)  # fmt: skip
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]


def test_export_import_federation_equals_the_simulation(processed, tmp_path, capsys):
    out = tmp_path / "fl"
    final = deploy(out, processed, FL_PARAMS, WILDCARDS, PARTITIONS, seeded=True,
                   timeout=300)  # fmt: skip
    work, fed = out / "openfl", out / RUN
    assert (final["status"], final["error"], final["jobs"]) == (["complete"], None, [str(fed)])
    assert sorted(p.name for p in out.iterdir()) == ["openfl", "results"]
    assert_imported(work)
    # one progress line per round, once its model was validated, the last with privacy.json's ε
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[openfl ")]
    assert [ln.split()[4] for ln in lines] == ["1/2", "2/2"], lines
    sim = tmp_path / "simulation"
    pooled = subset_folder(processed, tmp_path / "pooled", PARTITIONS)
    run(JobContext(pooled, sim, WILDCARDS, FL_PARAMS, job_seed("fets", WILDCARDS), device="cpu",
                   threads=1))  # fmt: skip

    got, want = state(fed / "model.pt"), state(sim / "model.pt")
    assert got.keys() == want.keys()
    assert max((got[k] - want[k]).abs().max().item() for k in want) <= 1e-6
    # the models trained: far from the initial weights (built as the simulation builds them)
    torch.manual_seed(common_seed("fets", WILDCARDS, "init"))
    init = build_model("resunet3d", in_channels=4, n_classes=4, base_filters=2, depth=2,
                       norm="group").state_dict()  # fmt: skip
    assert max((want[k] - init[k]).abs().max().item() for k in want) > 1e-3

    # every round's validation scores and privacy columns: the simulation's rounds.csv but
    # its simulated times and convergence score
    rounds, want_rounds = pd.read_csv(fed / "rounds.csv"), pd.read_csv(sim / "rounds.csv")
    timing = ["round_time_s", "sim_time_s", "convergence_score"]
    assert list(rounds.columns) == [c for c in want_rounds.columns if c not in timing]
    assert rounds["round"].tolist() == [0, 1, 2]
    pd.testing.assert_frame_equal(rounds, want_rounds[rounds.columns], rtol=1e-6, atol=1e-6)
    assert rounds["dice_mean_labels"].nunique() == 3  # a score per round, each model its own
    for line, row in zip(lines, rounds.iloc[1:].itertuples(), strict=True):
        assert {f"WT={row.dice_WT:.4g}", f"dice={row.dice_mean_labels:.4g}"} <= set(line.split())

    record = json.loads((fed / "privacy.json").read_text())
    assert f"eps={record['epsilon']:.4g}" in lines[-1].split()
    deployment = record["extra"].pop("deployment")
    want = json.loads((sim / "privacy.json").read_text())
    mine = ("covers", "not_covered")  # the files of this run
    assert {k: v for k, v in record.items() if k not in mine} == {
        k: v for k, v in want.items() if k not in mine
    }
    assert record["covers"].startswith(want["covers"]) and "model.pt" in record["covers"]
    # not_covered: exactly the run's files but model.pt and the launch's, each once
    named = [item.split(":", 1)[0] for item in record["not_covered"]]
    launch = [f"openfl/{p.name}" for p in work.iterdir()]
    assert sorted(named) == sorted([p.name for p in fed.iterdir() if p.name != "model.pt"] + launch)
    assert deployment["released_rounds"] == [1, 2] and deployment["not_released_rounds"] == []
    table = json.loads((work / "processes.json").read_text())["processes"]
    assert table == final["processes"]
    assert [p["name"] for p in table] == FX_STEPS + FEDERATION
    aggregator = table[len(FX_STEPS)]
    assert aggregator["ports"]["grpc"] > 0 and "fx aggregator start" in aggregator["command"]
    assert all(p["returncode"] == 0 and not live(p["pid"]) for p in table)


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen):
    """Poll `predicate` until it returns something truthy; fail if the launcher exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        assert proc.poll() is None, f"the launcher exited before {what}"
        time.sleep(0.1)
    raise AssertionError(f"no {what} in {timeout} s")


def test_a_killed_collaborator_stops_the_federation(processed, tmp_path):
    out = tmp_path / "crash"
    sets = [f"--set={k}={json.dumps(v)}" for k, v in FL_PARAMS.items()]
    cmd = [sys.executable, "-m", "dpmed.fets.openfl_deploy", "--out", str(out), "--processed",
           str(processed), "--eps", WILDCARDS["eps"], "--seeded", "--timeout", "240",
           *sets]  # fmt: skip
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the first collaborator that trains in round 2 (OpenFL's round 1), from the schedule
        choices = selection.schedule(PARTITIONS, FL_PARAMS["participation"], 2,
                                     FL_PARAMS["selection"],
                                     common_seed("fets", WILDCARDS, "schedule"))  # fmt: skip
        victim = process(out, f"collaborator-{choices[1].collaborators[0]}", launcher)
        log = Path(victim["log"])
        wait_for(lambda: "Round: 1 Received Tasks" in log.read_text(), 180, "round 2", launcher)
        os.killpg(victim["pid"], signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 1
    assert f"{victim['name']} (pid {victim['pid']}) died with exit code -9" in stderr

    record = json.loads((out / RUN / "privacy.json").read_text())
    deployment = record["extra"]["deployment"]
    assert deployment["status"] == "failed"
    assert (deployment["released_rounds"], deployment["not_released_rounds"]) == ([1], [2])
    assert record["steps"] == 1 and record["epsilon"] <= 1e6  # one round accounted
    final = json.loads((out / "openfl" / "processes.json").read_text())
    assert "died with exit code -9" in final["error"] and final["status"] == ["stopped"]
    assert (out / RUN / "model.pt").exists()  # round 1's release
    table = final["processes"]
    assert federation_names(table) == FEDERATION
    assert not any(live(p["pid"]) for p in table)


def launch(out: Path, processed: Path, *extra: str, rounds: int = 2) -> subprocess.Popen:
    """The launcher as a subprocess, as a scheduler starts it (the fl tests' parameters)."""
    sets = [f"--set={k}={json.dumps(v)}" for k, v in {**FL_PARAMS, "rounds": rounds}.items()]
    cmd = [sys.executable, "-m", "dpmed.fets.openfl_deploy", "--out", str(out), "--processed",
           str(processed), "--eps", WILDCARDS["eps"], "--timeout", "400", *sets,
           *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_launcher(launcher: subprocess.Popen) -> None:
    """After a failed assertion: SIGTERM (the launcher stops its processes), then SIGKILL."""
    if launcher.poll() is None:
        launcher.terminate()
        try:
            launcher.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.communicate()


def process(out: Path, name: str, launcher: subprocess.Popen) -> dict:
    """The processes.json entry of `name`, once the launcher has started it."""

    def entry():
        path = out / "openfl" / "processes.json"
        table = json.loads(path.read_text())["processes"] if path.exists() else []
        return next((p for p in table if p["name"] == name), None)

    return wait_for(entry, 120, name, launcher)


def listening(port: int) -> list[tuple[str, str, str]]:
    """(table, local address in /proc's hex, socket inode) of each listening TCP socket on
    `port`, from /proc/net/tcp and /proc/net/tcp6 (state 0A)."""
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":
                found.append((table, address, fields[9]))
    return found


# /proc's (table, local address) of a socket on 127.0.0.1: IPv4, or IPv4-mapped IPv6 as gRPC binds
LOOPBACK = ([("tcp", "0100007F")], [("tcp6", "0000000000000000FFFF00000100007F")])


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def assert_all_gone(out: Path) -> None:
    """Every process group the launcher recorded is gone."""
    for entry in json.loads((out / "openfl" / "processes.json").read_text())["processes"]:
        with pytest.raises(ProcessLookupError):
            os.killpg(entry["pid"], 0)


def test_sigterm_stops_every_process_and_keeps_the_record(processed, tmp_path):
    """SIGTERM to the launcher after round 1 is released: no process left, privacy.json and
    processes.json name round 1 released and the signal. Also: the aggregator listens on
    127.0.0.1 only, and the launcher warns that TLS is off."""
    out = tmp_path / "sigterm"
    launcher = launch(out, processed, rounds=3)
    try:
        agg = process(out, "aggregator", launcher)
        port = agg["ports"]["grpc"]
        sockets = wait_for(lambda: listening(port), 60, "listening socket", launcher)
        assert [(t, a) for t, a, _ in sockets] in LOOPBACK  # 127.0.0.1 only
        assert sockets[0][2] in socket_inodes(agg["pid"])
        records = out / "openfl" / "workspace" / "save" / "dp_rounds.jsonl"
        wait_for(lambda: records.exists() and records.read_text().count("\n") >= 1, 240,
                 "round 1 released", launcher)  # fmt: skip
        launcher.send_signal(signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        stop_launcher(launcher)
    assert launcher.returncode == 128 + signal.SIGTERM  # as the Flower launcher's
    assert "INSECURE: the OpenFL federation" in stderr
    assert "federation failed: the launcher received SIGTERM" in stderr
    assert_all_gone(out)
    deployment = json.loads((out / RUN / "privacy.json").read_text())["extra"]["deployment"]
    assert deployment["status"] == "failed" and deployment["released_rounds"][:1] == [1]
    assert deployment["not_released_rounds"][-1:] == [3]
    final = json.loads((out / "openfl" / "processes.json").read_text())
    assert (final["error"], final["status"]) == ("the launcher received SIGTERM", ["stopped"])


def test_a_stalled_collaborator_stops_the_run_naming_it(processed, tmp_path):
    """A collaborator stopped by SIGSTOP before it reports: the aggregator stops the run at
    the round timeout, naming it; nothing is left running."""
    out, round_timeout = tmp_path / "stall", 20
    launcher = launch(out, processed, "--round-timeout", str(round_timeout))
    try:
        victim = process(out, "collaborator-2", launcher)
        os.killpg(victim["pid"], signal.SIGSTOP)
        stopped = time.monotonic()
        _, stderr = launcher.communicate(timeout=round_timeout + 90)
        waited = time.monotonic() - stopped
    finally:
        stop_launcher(launcher)
    assert launcher.returncode == 1 and waited < round_timeout + 45, (waited, stderr)
    named = re.search(r"OpenFL round 0: collaborators \[(.*?)\] have not reported within the "
                      rf"round timeout of {round_timeout} s", stderr)  # fmt: skip
    assert named and "'2'" in named.group(1), stderr
    assert_all_gone(out)
    final = json.loads((out / "openfl" / "processes.json").read_text())
    assert final["status"] == ["stopped"] and named.group(0) in final["error"]


DROPPING = '''

class DroppingTaskRunner(FetsTaskRunner):
    """Collaborator {victim!r} uploads its training without tensor {tensor!r} (a test)."""

    def train_task(self, col_name, round_num, input_tensor_dict, **kwargs):
        trained, metrics = super().train_task(col_name, round_num, input_tensor_dict, **kwargs)
        if col_name == {victim!r}:
            trained = {{k: v for k, v in trained.items() if k.tensor_name != {tensor!r}}}
        return trained, metrics
'''


def test_a_malformed_upload_is_named(processed, tmp_path):
    """A collaborator whose upload lacks a tensor (OpenFL's aggregator cannot aggregate the
    round and waited forever): the run stops at the round's end naming it and the tensor."""
    choices = selection.schedule(PARTITIONS, FL_PARAMS["participation"], 2, FL_PARAMS["selection"],
                                 common_seed("fets", WILDCARDS, "schedule"))  # fmt: skip
    victim = str(choices[0].collaborators[-1])  # not the first: OpenFL skips us for its tensor
    torch.manual_seed(0)
    tensor = next(iter(build_model("resunet3d", in_channels=4, n_classes=4, base_filters=2,
                                   depth=2, norm="group").state_dict()))  # fmt: skip
    template = tmp_path / "template"
    shutil.copytree(TEMPLATE, template, ignore=shutil.ignore_patterns("__pycache__"))
    with open(template / "src" / "fets.py", "a", encoding="utf-8") as handle:
        handle.write(DROPPING.format(victim=victim, tensor=tensor))
    plan = template / "plan" / "plan.yaml"
    plan.write_text(
        plan.read_text().replace("src.fets.FetsTaskRunner", "src.fets.DroppingTaskRunner")
    )
    out = tmp_path / "dropped"
    with pytest.raises(FederationProcessError) as err:
        deploy(out, processed, FL_PARAMS, WILDCARDS, PARTITIONS, timeout=400, template=template)
    want = f"OpenFL round 0: collaborator '{victim}', tensor '{tensor}': 0 rows with key"
    assert want in str(err.value)
    final = json.loads((out / "openfl" / "processes.json").read_text())
    assert final["status"] == ["stopped"] and want in final["error"]
    assert_all_gone(out)
