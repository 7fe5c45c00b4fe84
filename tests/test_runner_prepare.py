"""One `prepare(job)` per runner (`dpmed.<study>.run.prepare`): the run, the study's privacy
audit and its preflight probes all build the job through it. Checked by recording the calls
of an audit and of every probe, and by stepping a prepared job with the runner's own loop: the
weights it ends with are the run's, byte for byte (same initial weights, data order and
noise). The studies' audits and probes are the ones their specs name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO, SEG_PARAMS, XCAL_PARAMS, xcal_processed
from test_privacy_audit_fets import PARAMS as FETS_PARAMS
from test_privacy_audit_fets import fets_processed

from dpmed.audit import study_runner
from dpmed.config.checks import load_configs
from dpmed.fets import run as fets_run
from dpmed.fets.collaborator import state_to_numpy
from dpmed.fets.probe import write_fets
from dpmed.fets.server import Server
from dpmed.preflight.study import StudyProbe, run_probe, study_probe
from dpmed.runtime import JobContext
from dpmed.seg import run as seg_run
from dpmed.studies import STUDIES
from dpmed.xcal import federation as xcal_fed
from dpmed.xcal import run as xcal_run
from dpmed.xcal.probe import write_medmnist

SEG_WC = {"dataset": "duke", "model": "unet", "clip": "flat", "morph": "none", "eps": "50",
          "seed": "0"}  # fmt: skip
XCAL_WC = {"dataset": "bloodmnist", "model": "resnet18", "method": "static", "shift": "iid",
           "clients": "3", "eps": "1", "seed": "0"}  # fmt: skip
FETS_WC = {"aggregator": "dp_fedavg", "dpmode": "sound", "eps": "1", "seed": "0"}
SEG = SEG_PARAMS | {"epochs": 1, "width": 4, "depth": 2, "optimizer": "sgd"}
XCAL = XCAL_PARAMS | {"rounds": 1}
FETS = FETS_PARAMS | {"rounds": 1}


@pytest.fixture(scope="module")
def blood(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("prepare_blood"), [60, 30, 30])


@pytest.fixture(scope="module")
def fets_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fets_processed(tmp_path_factory.mktemp("prepare_fets"))


def job(processed: Path, out: Path, wc: dict[str, str], params: dict[str, Any]) -> JobContext:
    return JobContext(processed, out, dict(wc), dict(params), 7, "cpu", 1)


def record_prepare(patch: pytest.MonkeyPatch, module: Any) -> list[JobContext]:
    """Record the jobs `module.prepare` is called with (it still builds them)."""
    calls: list[JobContext] = []
    prepare = module.prepare

    def recording(job: JobContext, *args: Any, **kwargs: Any) -> Any:
        calls.append(job)
        return prepare(job, *args, **kwargs)

    patch.setattr(module, "prepare", recording)
    return calls


def same_job(a: JobContext, b: JobContext) -> bool:
    """The same cell, seed and data (an audit may change how per-sample gradients are kept)."""
    return (a.wildcards, a.seed, Path(a.processed_dir)) == (b.wildcards, b.seed,
                                                            Path(b.processed_dir))  # fmt: skip


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k].to(a[k].device)) for k in a)


def saved_state(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]


def test_every_study_names_an_audit_runner_and_a_probe_that_load():
    for name, spec in STUDIES.items():
        assert isinstance(study_probe(name), StudyProbe), name
        probe = study_probe(name)
        assert {part.probe for part in probe.parts} == set(probe.probes), name
        if spec.audit_settings:
            assert study_runner(name).__module__ == f"dpmed.{name}.audit"


@pytest.mark.parametrize(
    ("study", "module", "wc", "params", "setting"),
    [("seg", seg_run, SEG_WC, SEG, "gradient"), ("seg", seg_run, SEG_WC, SEG, "input"),
     ("xcal", xcal_fed, XCAL_WC, XCAL, "gradient"), ("fets", fets_run, FETS_WC, FETS, "update")],
)  # fmt: skip
def test_the_audit_builds_its_job_with_prepare(
    duke, blood, fets_data, tmp_path, monkeypatch, study, module, wc, params, setting
):
    processed = {"seg": Path(duke), "xcal": blood, "fets": fets_data}[study]
    calls = record_prepare(monkeypatch, module)
    audited = job(processed, tmp_path, wc, params)
    study_runner(study)(audited, setting, 10, 0.95, 1.0)
    assert len(calls) == 1 and same_job(calls[0], audited)


def test_every_probe_builds_its_job_with_prepare(tmp_path, monkeypatch):
    config = load_configs([REPO / "config" / "config.yaml"])
    config["data"]["bloodmnist"] |= {"size": 28, "synthetic": {"counts": [60, 20, 20]}}
    config["data"]["fets"]["synthetic"]["shape"] = [16, 16, 16]
    config["data"]["duke"]["size"] = [32, 32]
    data = {"xcal": write_medmnist(config, "bloodmnist", tmp_path / "blood"),
            "fets": write_fets(config, "fets", tmp_path / "fets")}  # fmt: skip
    cells = {"seg": (seg_run, SEG_WC, SEG), "xcal": (xcal_fed, XCAL_WC, XCAL),
             "fets": (fets_run, FETS_WC, FETS)}  # fmt: skip
    for study, (module, wc, params) in cells.items():
        calls = record_prepare(monkeypatch, module)
        for part in study_probe(study).parts:
            spec = {"probe": part.probe, "study": study, "wildcards": wc, "params": params,
                    "seed": 3, "device": "cpu", "steps": 2, "config": {"data": config["data"]},
                    "data_dir": str(data.get(study, tmp_path)),
                    "work_dir": str(tmp_path / part.probe)}  # fmt: skip
            result = run_probe(spec)
            assert result["status"] == "ok", (part.probe, result.get("message"))
        assert len(calls) == len(study_probe(study).parts), study
        assert all(c.wildcards == wc and c.seed == 3 for c in calls), study
        monkeypatch.undo()


def test_a_prepared_seg_job_steps_to_the_runs_weights(duke, tmp_path):
    """One DP epoch of the prepared job through `train_epoch` ends with the run's model.pt."""
    seg_run.run(job(Path(duke), tmp_path / "run", SEG_WC, SEG))
    prepared = seg_run.prepare(job(Path(duke), tmp_path / "prepared", SEG_WC, SEG))
    prepared.net.train()
    seg_run.train_epoch(prepared.setup, prepared.plan, prepared.state, 0, prepared.device)
    assert same_state(prepared.net.state_dict(), saved_state(tmp_path / "run"))


def test_a_prepared_xcal_job_steps_to_the_runs_weights(blood, tmp_path):
    """One round of the prepared federation through `train_round` ends with the run's weights."""
    xcal_run.run(job(blood, tmp_path / "run", XCAL_WC, XCAL))
    fed = xcal_fed.prepare(job(blood, tmp_path / "prepared", XCAL_WC, XCAL))[1]
    history = xcal_fed.TrainState.start(fed.net)
    xcal_fed.train_round(fed, history, road_due=False)
    assert same_state(fed.net.state_dict(), saved_state(tmp_path / "run"))


def test_a_prepared_fets_job_aggregates_to_the_runs_weights(fets_data, tmp_path):
    """Round 1 of the prepared federation with the cell's server ends with the run's model."""
    fets_run.run(job(fets_data, tmp_path / "run", FETS_WC, FETS))
    prepared = fets_run.prepare(job(fets_data, tmp_path / "prepared", FETS_WC, FETS))
    federation = prepared.federation
    chosen = [str(c) for c in federation.choices[0].collaborators]
    state, _ = fets_run.aggregate_round(federation, Server(prepared.server),
                                        state_to_numpy(federation.model), chosen, 1)  # fmt: skip
    expected = {k: v.numpy() for k, v in saved_state(tmp_path / "run").items()}
    assert state.keys() == expected.keys()
    assert all((state[k] == expected[k]).all() and state[k].dtype == expected[k].dtype
               for k in state)  # fmt: skip
