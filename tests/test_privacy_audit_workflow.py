"""The empirical privacy audit in the workflow: the config's `audit` block (dpmed.config.audit),
the `privacy_audit` rule, results/tables/privacy_audit.csv and its figure
(dpmed.report.privacy_audit) and the audit columns of privacy_summary.csv.

Table and summary logic run on hand-made audit.json / privacy.json files whose expected values
are written out here; the config checks on edited copies of config/smoke.yaml."""

from __future__ import annotations

import copy
import functools
import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, SMOKE_CONFIG, run_snakemake
from snakemake_interface_common.exceptions import WorkflowError

import dpmed.config.audit as audit_config
from dpmed import job_cost
from dpmed.config.audit import AUDIT_FILE, audit_jobs, rule_job
from dpmed.config.checks import check_config, load_configs
from dpmed.config.grid import wildcards_from_path
from dpmed.errors import ConfigError
from dpmed.privacy.record import PrivacyRecord
from dpmed.report.privacy_audit import audit_table, run_audits, write_privacy_audit
from dpmed.report.privacy_summary import privacy_summary
from dpmed.studies import STUDIES

SCHEMA = REPO / "config" / "schema.yaml"
FLAT = "results/seg/duke/unet/flat/none/eps50/seed0"
NSGD = "results/seg/duke/unet/nsgd/none/eps50/seed0"
XCAL = "results/xcal/bloodmnist/resnet18/static/iid/c3/eps5/seed0"


@functools.cache
def _smoke() -> dict:
    return load_configs([SMOKE_CONFIG])


def smoke_with(cells: list[dict], **block) -> dict:
    """config/smoke.yaml with its audit block replaced by `cells` (and block keys)."""
    config = copy.deepcopy(_smoke())
    config["audit"] = {"canaries": 200, "confidence": 0.95, **block, "cells": cells}
    return config


# ------------------------------------------------------------------------------------ config


def test_audit_jobs_expand_cells_settings_and_noise_scales():
    config = smoke_with(
        [
            {"run": FLAT, "settings": ["gradient"], "noise_scales": [1, 0.1, 0]},
            {"run": XCAL + "/", "settings": ["gradient", "input"], "canaries": 100},
        ]
    )
    grid = check_config(config, SCHEMA)
    jobs = audit_jobs(config, grid)
    assert [(j.run, j.setting, j.noise_scale, j.canaries) for j in jobs] == [
        (FLAT, "gradient", 1.0, 200),
        (FLAT, "gradient", 0.1, 200),
        (FLAT, "gradient", 0.0, 200),
        (XCAL, "gradient", 1.0, 100),
        (XCAL, "input", 1.0, 100),
    ]
    cell = FLAT.removeprefix("results/seg/")
    assert jobs[1].path == f"results/audit/seg/{cell}/gradient/noise0.1"
    assert jobs[2].path.endswith("/gradient/noise0") and jobs[0].path.endswith("/noise1")
    assert jobs[3].dataset == "bloodmnist" and jobs[0].confidence == 0.95
    for job in jobs:  # the rule's wildcards give the job back, its cell that of the grid
        assert rule_job(config, job.rule_wildcards) == job
        assert job.wc == wildcards_from_path(job.study, job.run)


def test_the_schema_fills_defaults_and_an_absent_block_audits_nothing():
    config = smoke_with([{"run": FLAT, "settings": ["gradient"]}])
    del config["audit"]["canaries"], config["audit"]["confidence"]
    grid = check_config(config, SCHEMA)
    assert config["audit"]["canaries"] == 1000 and config["audit"]["confidence"] == 0.95
    assert config["audit"]["cells"][0]["noise_scales"] == [1]
    assert [j.canaries for j in audit_jobs(config, grid)] == [1000]
    bare = copy.deepcopy(_smoke())
    del bare["audit"]
    assert audit_jobs(bare, check_config(bare, SCHEMA)) == []


@pytest.mark.parametrize(
    ("cells", "key", "message"),
    [
        ([{"run": "results/seg/duke/unet/flat/none/eps7/seed0", "settings": ["gradient"]}],
         "audit.cells[0].run", "not a run folder of any study grid"),
        ([{"run": FLAT, "settings": ["gradient"]},
          {"run": "results/seg/duke/unet/none/none/epsinf/seed0", "settings": ["gradient"]}],
         "audit.cells[1].run", "not private"),
        ([{"run": FLAT, "settings": ["gradient"]}, {"run": NSGD, "settings": ["gradient"]},
          {"run": FLAT, "settings": ["gradient", "nosuch"], "noise_scales": [0]}],
         "audit.cells[2].settings[1]", "not 'nosuch'"),
        ([{"run": FLAT, "settings": ["gradient"], "noise_scales": [1, 0]},
          {"run": FLAT, "settings": ["gradient"], "noise_scales": [0]}],
         "audit.cells[1]", "audited twice"),
    ],
)  # fmt: skip
def test_a_bad_audit_cell_fails_at_parse_time_naming_the_key(cells, key, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        check_config(smoke_with(cells), SCHEMA)
    assert err.value.key == key


def test_settings_are_those_the_audit_runners_offer(monkeypatch):
    settings = STUDIES["xcal"].audit_settings
    config = smoke_with([{"run": XCAL, "settings": list(settings)}])
    assert len(audit_jobs(config, check_config(config, SCHEMA))) == len(settings)
    unaudited = {name: replace(spec, audit_settings=()) if name == "xcal" else spec
                 for name, spec in STUDIES.items()}  # fmt: skip
    monkeypatch.setattr(audit_config, "STUDIES", unaudited)
    with pytest.raises(ConfigError, match="xcal has no privacy audit") as err:
        check_config(smoke_with([{"run": XCAL, "settings": ["gradient"]}]), SCHEMA)
    assert err.value.key == "audit.cells[0].run"


def test_the_schema_refuses_unknown_keys_and_negative_noise():
    with pytest.raises(WorkflowError, match="setting"):
        check_config(smoke_with([{"run": FLAT, "setting": ["gradient"]}]), SCHEMA)
    with pytest.raises(WorkflowError):
        check_config(smoke_with([{"run": FLAT, "settings": ["gradient"], "noise_scales": [-1]}]),
                     SCHEMA)  # fmt: skip


def test_checking_audit_settings_loads_neither_torch_nor_opacus():
    """The config check reads the audit settings without the runners: parsing stays fast, and
    Opacus (which configures the root logger on import, so Snakemake printed every log line
    twice) is not loaded."""
    code = (
        "import logging\n"
        "from dpmed.config.checks import check_config, load_configs\n"
        "from dpmed.install import workflow_file\n"
        "config = load_configs([workflow_file('config/smoke.yaml')])\n"
        "check_config(config, workflow_file('config/schema.yaml'))\n"
        "import sys\n"
        "loaded = [m in sys.modules for m in ('opacus', 'torch')]\n"
        "print(len(logging.getLogger().handlers), *loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.split() == ["0", "False", "False"], result.stderr[-2000:]


# ------------------------------------------------------------------------------ rule (dry run)


def test_smoke_dry_run_plans_one_audit_job_per_configured_audit_sized_as_its_training(tmp_path):
    config = load_configs([SMOKE_CONFIG])
    grid = check_config(config, SCHEMA)
    wanted = audit_jobs(config, grid)
    assert {j.study for j in wanted} >= {"seg", "xcal"}
    result = run_snakemake("-n", "--configfile", str(SMOKE_CONFIG), "--directory", str(tmp_path))
    # each job: its `rule <name>:` line and the `    key: value` lines right below it
    jobs = re.findall(r"^rule (\w+):\n((?: {4}\w+: .*\n)+)", result.stdout, flags=re.M)
    audits = [dict(re.findall(r"^ {4}(\w+): (.*)$", body, flags=re.M))
              for rule, body in jobs if rule == "privacy_audit"]  # fmt: skip
    outputs = sorted(fields["output"] for fields in audits)
    assert outputs == sorted(f"{j.path}/{AUDIT_FILE}" for j in wanted)
    for fields in audits:
        wc = dict(item.split("=", 1) for item in fields["wildcards"].split(", "))
        job = rule_job(config, wc)
        inputs = fields["input"].split(", ")
        assert all(f.startswith(f"data/processed/{job.dataset}/") for f in inputs), inputs
        assert not any(f.endswith("model.pt") for f in inputs)  # the audit retrains
        want = job_cost.request(
            f"{job.study}_train", config, job.wc, grid.params(job.study, job.wc)
        )
        res = dict(re.findall(r"(\w+)=([^,]+)", fields["resources"]))
        assert (int(res["mem_mb"]), int(res["runtime"]), res["gpu"]) == (
            want.mem_mb, want.runtime, "0"), fields  # fmt: skip
        assert fields["log"].startswith("logs/privacy_audit/") and "benchmark" in fields
    assert [rule for rule, _ in jobs].count("privacy_audit_report") == 1


# --------------------------------------------------------------------------- table and summary


def write_audit(root: Path, study: str, run: str, setting: str, noise: float, claimed: float,
                lower: float, guarantee: str = "dp") -> str:  # fmt: skip
    """A hand-made audit.json as dpmed.privacy.audit.cell.CellAudit.record() writes it."""
    wildcards = wildcards_from_path(study, f"results/{run}")
    record = {
        "study": study, "mechanism": "m", "setting": setting, "guarantee": guarantee,
        "eps_claimed": claimed, "noise_scale": noise, "canary_norm": 1.0,
        "wildcards": wildcards, "eps_lower": lower, "confidence": 0.95, "canaries": 200,
        "guesses": 40, "correct": 30, "delta": 1e-5, "k_pos": 20, "k_neg": 20,
    }  # fmt: skip
    path = root / "results" / "audit" / run / setting / f"noise{noise:g}" / AUDIT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return str(path)


SEG_RUN = "seg/duke/unet/flat/none/eps2/seed0"
NSGD_RUN = "seg/duke/unet/nsgd/none/eps2/seed0"
XCAL_RUN = "xcal/bloodmnist/resnet18/static/iid/c3/eps5/seed0"
UNAUDITED = "seg/duke/unet/psac/none/eps2/seed0"


GUARANTEES = {SEG_RUN: "dp", NSGD_RUN: "paper-approximation", XCAL_RUN: "dp", UNAUDITED: "dp"}


def hand_made_audits(root: Path) -> list[str]:
    return [
        write_audit(root, "seg", SEG_RUN, "gradient", 1, 2.0, 0.7),
        write_audit(root, "seg", SEG_RUN, "gradient", 0, 2.0, 4.4),  # power control: no flag
        # another recipe of the cell (the clip rule's public-code noise): table only
        write_audit(root, "seg", SEG_RUN, "paper-noise", 1, 2.0, 3.0, "paper-approximation"),
        write_audit(root, "seg", NSGD_RUN, "gradient", 1, 2.0, 2.5, "paper-approximation"),
        write_audit(root, "xcal", XCAL_RUN, "input", 1, 5.0, 0.1),
        write_audit(root, "xcal", XCAL_RUN, "gradient", 1, 5.0, 1.2),
        write_audit(root, "xcal", XCAL_RUN, "gradient", 0.1, 5.0, 5.0),  # equal: no violation
    ]


def test_audit_table_rows_columns_and_violations(tmp_path):
    table = audit_table(reversed(hand_made_audits(tmp_path)))
    required = ["study", "mechanism", "setting", "guarantee", "eps_claimed", "eps_lower",
                "confidence", "canaries", "guesses", "correct", "noise_scale", "canary_norm",
                "run", "violation"]  # fmt: skip
    assert set(required) <= set(table.columns)
    assert list(zip(table["run"], table["setting"], table["noise_scale"], strict=True)) == [
        (SEG_RUN, "gradient", 1.0),
        (SEG_RUN, "gradient", 0.0),
        (SEG_RUN, "paper-noise", 1.0),
        (NSGD_RUN, "gradient", 1.0),
        (XCAL_RUN, "gradient", 1.0),
        (XCAL_RUN, "gradient", 0.1),
        (XCAL_RUN, "input", 1.0),
    ]
    # every row compares with the claim; at noise scale 0 exceeding it is the control working
    assert table["violation"].tolist() == [False, True, True, True, False, False, False]
    assert table["correct"].tolist() == [30] * 7 and table["canaries"].tolist() == [200] * 7


def test_run_audits_take_the_largest_bound_of_the_run_as_configured(tmp_path):
    per_run = run_audits(hand_made_audits(tmp_path), GUARANTEES)
    assert per_run.to_dict("index") == {
        NSGD_RUN: {"audit_eps_lower": 2.5, "audit_violation": True},
        # noise 0's 4.4 and the paper-noise recipe's 3.0 left out
        SEG_RUN: {"audit_eps_lower": 0.7, "audit_violation": False},
        XCAL_RUN: {"audit_eps_lower": 1.2, "audit_violation": False},
    }
    assert run_audits([], GUARANTEES).empty


def privacy_json(root: Path, run: str, eps: float) -> str:
    record = PrivacyRecord(
        mechanism="m", adjacency="adj", sampling="poisson", accountant="rdp", epsilon=eps,
        delta=1e-5, guarantee=GUARANTEES[run], noise_multipliers=[1.0],
        epsilon_by_accountant={"rdp": eps}, reasons=["r"] * (GUARANTEES[run] != "dp"),
        covers="the model weights",
    )  # fmt: skip
    path = root / "results" / run / "privacy.json"
    record.write(path, "duke")
    return str(path)


def test_privacy_summary_flags_audited_runs_and_leaves_the_others_empty(tmp_path):
    audits = hand_made_audits(tmp_path)
    runs = {SEG_RUN: 2.0, NSGD_RUN: 2.0, XCAL_RUN: 5.0, UNAUDITED: 2.0}
    privacy = [privacy_json(tmp_path, run, eps) for run, eps in runs.items()]
    summary = privacy_summary(privacy, audits).set_index("run")
    assert summary.loc[NSGD_RUN, "audit_violation"] is True
    assert summary.loc[SEG_RUN, "audit_violation"] is False
    assert summary.loc[XCAL_RUN, "audit_violation"] is False
    assert summary.loc[UNAUDITED, "audit_violation"] == ""
    assert summary.loc[XCAL_RUN, "audit_eps_lower"] == 1.2
    assert math.isnan(summary.loc[UNAUDITED, "audit_eps_lower"])
    without = privacy_summary(privacy)
    assert (without["audit_violation"] == "").all() and without["audit_eps_lower"].isna().all()
    csv = tmp_path / "summary.csv"
    privacy_summary(privacy, audits).to_csv(csv, index=False)
    back = pd.read_csv(csv, keep_default_na=False).set_index("run")["audit_violation"]
    assert back.to_dict() == {NSGD_RUN: "True", SEG_RUN: "False", XCAL_RUN: "False", UNAUDITED: ""}


def test_write_privacy_audit_gives_table_twins_and_a_deterministic_figure(tmp_path):
    audits = hand_made_audits(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_privacy_audit(audits, tmp_path / name / "t.csv", tmp_path / name / "t.png")
    for ext in (".csv", ".md", ".html", ".png", ".pdf"):
        first, second = (tmp_path / name / f"t{ext}" for name in ("a", "b"))
        assert first.read_bytes() == second.read_bytes(), ext
    table = pd.read_csv(tmp_path / "a" / "t.csv")
    assert table["violation"].tolist() == audit_table(audits)["violation"].tolist()
    with pytest.raises(ValueError, match="no audit.json"):
        write_privacy_audit([], tmp_path / "c.csv", tmp_path / "c.png")


# ------------------------------------------------------------------------------ the smoke run


@pytest.mark.slow
def test_smoke_run_audits_every_configured_cell(smoke_run):
    config = load_configs([SMOKE_CONFIG])
    wanted = audit_jobs(config, check_config(config, SCHEMA))
    table = pd.read_csv(smoke_run / "results/tables/privacy_audit.csv")
    assert len(table) == len(wanted)
    got = sorted(zip(table["run"], table["setting"], table["noise_scale"], strict=True))
    assert got == sorted((j.run.removeprefix("results/"), j.setting, j.noise_scale) for j in wanted)
    assert (table["eps_lower"] >= 0).all() and (table["guesses"] <= table["canaries"]).all()
    for ext in (".png", ".pdf"):
        assert (smoke_run / f"results/figures/privacy_audit{ext}").stat().st_size > 0
    summary = pd.read_csv(smoke_run / "results/tables/privacy_summary.csv", keep_default_na=False)
    guarantee = dict(zip(summary["run"], summary["guarantee"], strict=True))
    configured = table[
        (table["noise_scale"] == 1) & (table["guarantee"] == table["run"].map(guarantee))
    ]
    flagged = summary[summary["audit_violation"] != ""]
    assert set(flagged["run"]) == set(configured["run"])
    assert {run.split("/")[0] for run in flagged["run"]} == {j.study for j in wanted}
