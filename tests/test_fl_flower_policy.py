"""A server that asks real SuperNodes (Flower's deployment engine on 127.0.0.1) for more than
their sites' policies allow: the run fails at the roll call with the ClientApp's refusal, which
names the client, the plan's key and both values, and no node trains."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import FLOWER_PARAMS, FLOWER_WILDCARDS, xcal_processed

from dpmed.config.grid import job_seed
from dpmed.runtime import JobContext

pytest.importorskip("flwr")
from dpmed.xcal.flower.deploy import local_federation, site_configs  # noqa: E402
from dpmed.xcal.flower.runconfig import run_path, write_run_config  # noqa: E402

pytestmark = pytest.mark.fl


def test_a_server_asking_for_another_epsilon_fails_at_the_roll_call(tmp_path):
    data = xcal_processed(tmp_path / "data", [90, 10, 20])
    wc, params = FLOWER_WILDCARDS, FLOWER_PARAMS
    admitted = JobContext(data, tmp_path / run_path(wc), wc, params, job_seed("xcal", wc), "cpu", 1)
    asked_wc = {**wc, "eps": "1000000000"}
    asked = replace(
        admitted,
        wildcards=asked_wc,
        out_dir=tmp_path / run_path(asked_wc),
        seed=job_seed("xcal", asked_wc),
    )
    timeouts = {"round-timeout": 40, "connect-timeout": 60}
    run_config = write_run_config(tmp_path / "run-config.toml", asked, **timeouts)
    work = tmp_path / "flower"
    with local_federation(work, site_configs(admitted, work, seeded=True)) as federation:
        flwr_run = federation.start_run(run_config)
        flwr_run.popen.wait(timeout=300)
        status = federation.run_status(flwr_run)
    assert status == "finished:failed"
    logs = "".join(p.log_path.read_text(errors="replace") for p in federation.processes())
    assert "did not answer the roll call" in logs
    assert (
        "refuses the plan: the plan's wildcards.eps 1000000000.0 differs from the site "
        "policy's eps 2.0" in logs
    )
    assert not list(work.glob("site-*/state/*.pt"))  # no node trained
    assert not (Path(asked.out_dir) / "model.pt").exists()
