"""A fourth study is its own package and one registration line.

The toy study of tests/toy_study/ (the private mean image of a toy MedMNIST-like dataset that
its package registers: its spec, schema, rule file, caption, job, table writer, sizing, probe
and audit) is copied into a scratch copy of the repository, registered by one added line in
`dpmed.studies`, and run through the real workflow: the dataset built, the study's jobs, its
table, its privacy audit cell, the cross-study privacy summary, then its preflight probe and
the job sizing. Nothing else of the repository differs; the copy is removed afterwards.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG

TOY = Path(__file__).with_name("toy_study")
REGISTRATION = '    "toy",\n'
RUNS = [f"results/toy/toymnist/eps{eps}/seed0" for eps in ("1", "inf")]
AUDIT = "results/audit/toy/toymnist/eps1/seed0/record/noise1/audit.json"


def repository_copy(root: Path) -> Path:
    """The repository's files (tracked, and untracked ones git does not ignore) under root."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file() and not name.startswith("tests/"):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    return root


def add_toy_study(root: Path) -> list[str]:
    """Copy the toy study's own files in and register it; returns the paths added."""
    added = []
    for source in sorted(p for p in TOY.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        target = root / source.relative_to(TOY)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        added.append(source.relative_to(TOY).as_posix())
    registry = root / "src" / "dpmed" / "studies.py"
    text = registry.read_text()
    anchor = '    "xcal",\n'
    assert text.count(anchor) == 1
    registry.write_text(text.replace(anchor, anchor + REGISTRATION))
    return added


def differing(root: Path, pristine: Path) -> list[str]:
    """The files under `root` (bytecode caches aside) that `pristine` lacks or holds otherwise."""
    files = (p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return sorted(
        path.relative_to(root).as_posix()
        for path in files
        if not (pristine / path.relative_to(root)).is_file()
        or not filecmp.cmp(path, pristine / path.relative_to(root), shallow=False)
    )


def toy_config(path: Path) -> Path:
    """The smoke config with the three studies' grids empty, a toy grid and one audit cell."""
    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    config["data"]["toymnist"] = config["data"]["pneumoniamnist"]
    for study in ("seg", "fets", "xcal"):
        config[study]["grid"] = []
    config["toy"] = {
        "defaults": {"clip_norm": 10.0, "delta": 1.0e-5},
        "grid": [{"datasets": ["toymnist"], "eps": [1, "inf"], "seeds": [0]}],
    }
    config["audit"] = {
        "canaries": 200,
        "confidence": 0.95,
        "cells": [{"run": RUNS[0], "settings": ["record"], "noise_scales": [1]}],
    }
    config["resources"] = {"max_mem_mb": 4000, "max_runtime": 30}
    path.write_text(yaml.safe_dump(config))
    return path


def snakemake(root: Path, workdir: Path, configfile: Path, *extra: str) -> str:
    """Run the workflow of the repository copy `root` in `workdir`; returns what it printed."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(root / "src")}
    command = [sys.executable, "-m", "snakemake", "-s", str(root / "Snakefile"),
               "--directory", str(workdir), "--configfile", str(configfile), "--cores", "2",
               *extra]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-6000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory):
    pristine = repository_copy(tmp_path_factory.mktemp("pristine"))
    root = tmp_path_factory.mktemp("repository") / "copy"
    shutil.copytree(pristine, root)
    added = add_toy_study(root)
    workdir = tmp_path_factory.mktemp("toy_run")
    configfile = toy_config(workdir / "toy.yaml")
    snakemake(root, workdir, configfile)
    yield root, pristine, workdir, configfile, added
    shutil.rmtree(root)
    shutil.rmtree(pristine)


@pytest.mark.slow
def test_the_toy_study_is_its_package_and_one_line(toy_run):
    root, pristine, _, _, added = toy_run
    # its package (spec, schema, rule file, caption, job, sizing, probe, audit); nothing else
    assert [path for path in added if not path.startswith("src/dpmed/toy/")] == []
    names = {Path(path).name for path in added}
    assert names >= {"spec.py", "schema.yaml", "rules.smk", "toy_table.rst", "run.py"}
    assert names >= {"sizing.py", "probe.py", "audit.py"}
    # after the whole workflow ran: the package and the registry differ, no other path
    assert differing(root, pristine) == sorted([*added, "src/dpmed/studies.py"])
    ours = (pristine / "src" / "dpmed" / "studies.py").read_text().splitlines(keepends=True)
    theirs = (root / "src" / "dpmed" / "studies.py").read_text().splitlines(keepends=True)
    assert [text for text in theirs if text not in ours] == [REGISTRATION]
    assert len(theirs) == len(ours) + 1


@pytest.mark.slow
def test_a_registered_study_without_a_config_section_plans_an_empty_grid(toy_run, tmp_path):
    """The smoke config, which has no `toy` section, plans the same jobs with the toy registered
    as without it."""
    root, pristine, _, _, _ = toy_run

    def planned(repository: Path) -> list[str]:
        stats = snakemake(repository, tmp_path / repository.name, SMOKE_CONFIG, "-n", "--quiet",
                          "rules")  # fmt: skip
        return sorted(line for line in stats.splitlines() if re.fullmatch(r"\w+ +\d+", line))

    jobs = planned(root)
    assert any(line.startswith("seg_train ") for line in jobs), jobs
    assert jobs == planned(pristine)


@pytest.mark.slow
def test_the_toy_jobs_table_audit_and_privacy_summary_run(toy_run):
    _, _, workdir, _, _ = toy_run
    for run in RUNS:
        metrics = json.loads((workdir / run / "metrics.json").read_text())
        privacy = json.loads((workdir / run / "privacy.json").read_text())
        assert (metrics["sigma"] > 0) == run.endswith("eps1/seed0")
        assert privacy["epsilon"] == (1.0 if run.endswith("eps1/seed0") else None)
    datasets = pd.read_csv(workdir / "results" / "tables" / "datasets.csv")
    assert set(datasets["dataset"]) == {"toymnist"}  # built and summarised
    assert (workdir / "data" / "processed" / "toymnist" / "train.npz").exists()
    table = pd.read_csv(workdir / "results" / "tables" / "toy.csv")
    assert sorted(table["run"]) == RUNS
    audit = json.loads((workdir / AUDIT).read_text())
    assert audit["study"] == "toy" and audit["setting"] == "record"
    # a lower bound of a sound (1, 1e-5)-DP mechanism stays below its ε
    assert 0 <= audit["eps_lower"] <= audit["eps_claimed"] == 1.0
    assert (workdir / "results" / "tables" / "privacy_audit.csv").exists()
    summary = pd.read_csv(workdir / "results" / "tables" / "privacy_summary.csv")
    assert summary.to_csv().count("toy") >= len(RUNS)


@pytest.mark.slow
def test_the_toy_study_is_probed_and_sized(toy_run):
    root, _, workdir, configfile, _ = toy_run
    snakemake(root, workdir, configfile, "--config", "preflight=true")
    cells = pd.read_csv(workdir / "results" / "preflight" / "preflight.csv")
    # one row per (cell, ε): probed, and σ calibrated for the private ε
    assert list(cells["study"]) == ["toy", "toy"], cells.to_string()
    assert list(cells["status"]) == ["ok", "ok"], cells.to_string()
    private = cells[cells["eps"] == 1.0].iloc[0]
    assert bool(private["eps_ok"]) and private["eps_accounted"] <= 1.0
    assert private["s_per_step"] > 0
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    sized = subprocess.run([sys.executable, "-m", "dpmed.job_cost", str(configfile)],
                           cwd=root, env=env, capture_output=True, text=True)  # fmt: skip
    assert sized.returncode == 0, sized.stderr
    # no fitted cost model yet: the toy rule asks for the config's caps
    rows = [line.split()[:3] for line in sized.stdout.splitlines()]
    assert ["toy_train", "4000", "30"] in rows, sized.stdout


def test_a_study_without_its_optional_parts_is_sized_probed_and_audited_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A registered study whose package has no sizing, probe, audit or claims module: every
    layer that looks for those parts passes it by instead of failing."""
    import dpmed
    from dpmed.audit import audited_studies
    from dpmed.preflight.study import study_rules
    from dpmed.sizing import sized_rules, study_sizing
    from dpmed.studies import STUDIES, part_module, study_part

    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "__init__.py").write_text("")
    monkeypatch.setattr(dpmed, "__path__", [*dpmed.__path__, str(tmp_path)])
    STUDIES.add("bare", replace(STUDIES["xcal"], name="bare", audit_settings=(), claims=None))
    study_sizing.cache_clear()
    try:
        assert [part_module("bare", part) for part in ("sizing", "probe", "audit")] == [None] * 3
        assert study_part("bare", "audit", "audit_cell") is None
        assert part_module("xcal", "sizing") == "dpmed.xcal.sizing"
        assert "bare" not in set(sized_rules().values()) and "xcal_train" in sized_rules()
        assert "bare" not in study_rules() and "xcal" in study_rules()
        assert "bare" not in audited_studies()
    finally:
        STUDIES.remove("bare")
        study_sizing.cache_clear()
