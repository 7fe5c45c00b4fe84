"""DP-SimAgg in a real OpenFL 1.9 federation (`dpmed.fets.openfl_deploy`): an aggregator and
three collaborator processes started with `fx`, talking gRPC on 127.0.0.1.

(a) With the simulation's seeds (initial weights, schedule, local training, server noise), the
federation's final model equals the in-process simulation `dpmed.fets.run` on the same three
partitions, and so does its privacy record. (b) A collaborator killed by SIGKILL mid-round:
OpenFL's aggregator would wait for it forever, so the launcher stops the federation with an
error naming it, and privacy.json accounts for the rounds released before it only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_fets_simulation import PARAMS, _processed

from dpmed.config.grid import common_seed, job_seed
from dpmed.fets import selection
from dpmed.fets.openfl_deploy import deploy, subset_folder
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


def test_federation_equals_the_simulation(processed, tmp_path, capsys):
    fed = tmp_path / "openfl"
    outcome = deploy(fed, processed, FL_PARAMS, WILDCARDS, PARTITIONS, seeded_noise=True,
                     timeout=300)  # fmt: skip
    assert (outcome.status, outcome.released) == ("complete", 2)
    # one progress line per released round, the last with the ε privacy.json states
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

    record = json.loads((fed / "privacy.json").read_text())
    assert f"eps={record['epsilon']:.4g}" in lines[-1].split()
    deployment = record["extra"].pop("deployment")
    assert record == json.loads((sim / "privacy.json").read_text())
    assert deployment["released_rounds"] == [1, 2] and deployment["not_released_rounds"] == []
    table = json.loads((fed / "processes.json").read_text())
    names = [p["name"] for p in table]
    assert names == ["plan-initialize", "aggregator", "collaborator-1", "collaborator-2",
                     "collaborator-3"]  # fmt: skip
    assert table[1]["ports"]["grpc"] > 0 and "fx aggregator start" in table[1]["command"]
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
           str(processed), "--eps", WILDCARDS["eps"], "--seeded-noise", "--timeout", "240",
           *sets]  # fmt: skip
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        table = wait_for(lambda: (out / "processes.json").exists()
                         and json.loads((out / "processes.json").read_text()),
                         120, "process list", launcher)  # fmt: skip
        # the first collaborator that trains in round 2 (OpenFL's round 1), from the schedule
        choices = selection.schedule(PARTITIONS, FL_PARAMS["participation"], 2,
                                     FL_PARAMS["selection"],
                                     common_seed("fets", WILDCARDS, "schedule"))  # fmt: skip
        name = f"collaborator-{choices[1].collaborators[0]}"
        victim = next(p for p in table if p["name"] == name)
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

    record = json.loads((out / "privacy.json").read_text())
    deployment = record["extra"]["deployment"]
    assert deployment["status"] == "failed"
    assert (deployment["released_rounds"], deployment["not_released_rounds"]) == ([1], [2])
    assert record["steps"] == 1 and record["epsilon"] <= 1e6  # one round accounted
    federation = json.loads((out / "federation.json").read_text())
    assert "died with exit code -9" in federation["error"]
    assert (out / "model.pt").exists()  # round 1's release
    table = json.loads((out / "processes.json").read_text())
    assert [p["name"] for p in table][1:] == ["aggregator", "collaborator-1", "collaborator-2",
                                              "collaborator-3"]  # fmt: skip
    assert not any(live(p["pid"]) for p in table)
