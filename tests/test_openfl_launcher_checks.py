"""The OpenFL launcher before any process starts (issue 53), without OpenFL processes: every
`--set`, `--eps`, `--seed` and timeout is checked against the config schema and refused naming
its key and value with nothing created; one launch per --out (a second one stops at once,
naming the folder, and changes nothing); the aggregator's gRPC server listens on the plan's
`bind_addr` only, refuses a port another gRPC server holds and warns when TLS is off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_fets_simulation import PARAMS, _processed

from dpmed import federation_processes as fp
from dpmed.fets import openfl_deploy as od

pytest.importorskip("openfl")
DEPLOY = od.deploy  # the real one (`no_launch` replaces it in the module)
WILDCARDS = {"aggregator": "dp_simagg", "dpmode": "sound", "eps": "1", "seed": "0"}


@pytest.fixture
def no_launch(monkeypatch):
    """Nothing may be prepared or deployed; a valid launch's arguments are kept instead."""
    calls = []

    def refuse(*args, **kwargs):
        raise AssertionError("reached the data stage")

    monkeypatch.setattr(od, "synthetic_processed", lambda *args: Path("processed"))
    monkeypatch.setattr(od, "deploy", lambda *args, **kwargs: calls.append((args, kwargs)) or
                        refuse())  # fmt: skip
    return calls


BAD = {  # arguments → what the error names
    "eps-nan": (["--eps", "nan"], "'fets.grid[3].eps[0]': got nan"),
    "eps-negative": (["--eps", "-1"], "['eps'][0]: -1.0"),
    "eps-text": (["--eps", "one"], "'--eps': got 'one'"),
    "eps-inf": (["--eps", "inf"], "'fets.grid[3]': no valid combination"),
    "delta": (["--set", "delta=2"], "['fets']['defaults']['delta']: 2"),
    "delta-nan": (["--set", "delta=nan"], "'fets.defaults.delta': got nan"),
    "rounds": (["--set", "rounds=-3"], "['fets']['defaults']['rounds']: -3"),
    "bogus": (["--set", "bogus_key=1"], "'bogus_key' was unexpected"),
    "type": (["--set", "lr=fast"], "['fets']['defaults']['lr']: 'fast'"),
    "seed": (["--seed", "-1"], "'--seed': got '-1'"),
    "round-timeout": (["--round-timeout", "nan"], "--round-timeout: expected a positive number"),
    "fedavg-paper": (
        ["--aggregator", "dp_fedavg", "--dpmode", "paper"],
        "'--dpmode': dp_fedavg has no DP mode 'paper' (known: sound)",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_values_are_refused_naming_the_key(case, tmp_path, capsys, no_launch):
    argv, named = BAD[case]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        od.main(["--out", str(out), *argv])
    assert stop.value.code == 2
    assert named in capsys.readouterr().err
    assert not out.exists() and not no_launch  # nothing created, nothing started


def test_good_values_reach_the_launch(tmp_path, no_launch):
    with pytest.raises(AssertionError, match="reached the data stage"):
        od.main(["--out", str(tmp_path / "out"), "--eps", "2.5", "--seed", "3", "--set",
                 "rounds=2", "--set", "delta=1e-6", "--round-timeout", "30"])  # fmt: skip
    ((args, kwargs),) = no_launch
    params, wildcards = args[2], args[3]
    assert (params["rounds"], params["delta"], params["lr"]) == (2, 1e-6, 0.03)
    assert (wildcards["eps"], wildcards["seed"], kwargs["round_timeout"]) == ("2.5", "3", 30.0)


def test_dp_fedavg_reaches_the_plan(tmp_path, no_launch):
    """Any private aggregator deploys, not only DP-SimAgg: the plan's aggregation function
    is built for the launch's aggregator."""
    with pytest.raises(AssertionError, match="reached the data stage"):
        od.main(["--out", str(tmp_path / "out"), "--aggregator", "dp_fedavg"])
    ((args, _),) = no_launch
    params, wildcards = args[2], args[3]
    assert wildcards["aggregator"] == "dp_fedavg"
    cfg = od.server_config(params, wildcards, None)
    template = yaml.safe_load((od.TEMPLATE / "plan" / "plan.yaml").read_text())
    plan = od.fill_plan(template, params, wildcards, cfg, port=1)
    settings = plan["tasks"]["train"]["aggregation_type"]["settings"]
    assert (settings["aggregator"], settings["mode"]) == ("dp_fedavg", "sound")
    from dpmed.fets.openfl_components import DPSimAggregation

    func = DPSimAggregation(**{k: v for k, v in settings.items() if k != "output_dir"}).func
    assert func.cfg == cfg


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dpmed.federation_processes import launch_lock
    with launch_lock(Path(sys.argv[1])):
        print("held", flush=True)
        sys.stdin.readline()
""")


def test_one_launch_per_out_folder(tmp_path, capsys, no_launch):
    out = (tmp_path / "out").resolve()
    work = out / "openfl"  # the launch's folder, as fl-flower's is OUT/flower
    (work / "workspace").mkdir(parents=True)
    (work / "processes.json").write_text("{}")  # the first launch's live files
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(work)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert first.stdout.readline() == "held\n"
        assert od.main(["--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert f"{work} is in use by another launch (pid {first.pid} holds" in err
        with pytest.raises(fp.FederationProcessError, match="in use by another launch"):
            DEPLOY(out, tmp_path, {}, WILDCARDS, [1])
        assert (work / "workspace").is_dir() and (work / "processes.json").read_text() == "{}"
        assert not no_launch and first.poll() is None  # the first launch runs on
    finally:
        first.communicate("\n", timeout=30)
    with fp.launch_lock(work), fp.launch_lock(work):  # free again; nested in one process
        assert (work / ".lock").read_text() == str(os.getpid())


def test_the_layout_is_flowers(tmp_path, monkeypatch):
    """OUT/openfl holds the launch (processes.json, sites, workspace), OUT/<run> the run's
    outputs, an older run's removed first; privacy.json-free here: the federation (replaced)
    validated the initial model and then failed."""
    processed = _processed(tmp_path / "fets")
    out = tmp_path / "out"
    run = out / "results/fets/dp_simagg/sound/eps1/seed0"
    run.mkdir(parents=True)
    (run / "model.pt").write_text("an older run's")

    def failed(workspace, record, collaborators, port, timeout, progress):
        assert workspace == (out / "openfl" / "workspace").resolve()
        (workspace / "save" / od.VALIDATION).write_text('{"round": 0, "dice_WT": 0.5}\n')
        return fp.FederationProcessError("stopped")

    monkeypatch.setattr(od, "run_federation", failed)
    with pytest.raises(fp.FederationProcessError, match="stopped"):
        DEPLOY(out, processed, {**PARAMS, "rounds": 1}, WILDCARDS, [1, 2])
    assert sorted(p.name for p in out.iterdir()) == ["openfl", "results"]
    launch = sorted(p.name for p in (out / "openfl").iterdir())
    assert launch == [".lock", "processes.json", "sites", "workspace"]
    assert sorted(p.name for p in run.iterdir()) == ["rounds.csv"]
    record = json.loads((out / "openfl" / "processes.json").read_text())
    assert (record["jobs"], record["status"]) == ([str(run.resolve())], ["stopped"])


def test_aggregator_server_binds_its_address_and_no_shared_port(capsys):
    import grpc
    from openfl.transport.grpc import aggregator_server, common

    from dpmed.fets.openfl_components import patch_openfl

    patch_openfl()
    port = fp.free_port()
    server = aggregator_server.AggregatorGRPCServer(
        SimpleNamespace(connector=None), port, use_tls=False, require_client_auth=False,
        bind_addr="127.0.0.1",
    )  # fmt: skip
    assert server.uri == f"127.0.0.1:{port}"
    assert "INSECURE: the OpenFL aggregator serves" in capsys.readouterr().err
    other = grpc.server(ThreadPoolExecutor(1))
    other.add_insecure_port(f"127.0.0.1:{port}")  # gRPC's default: SO_REUSEPORT
    other.start()
    try:
        with pytest.raises(RuntimeError, match=f"Failed to bind to address 127.0.0.1:{port}"):
            common.create_grpc_server(server.uri, False, None, None, None, False)
    finally:
        other.stop(0)
