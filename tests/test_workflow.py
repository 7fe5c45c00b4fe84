"""The Snakemake workflow: lint, config errors on the command line, studies left out, and the
smoke data stage (twice, byte-identical)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG, run_data_stage, run_snakemake

from dpmed.data.registry import DATASETS
from dpmed.data.synthetic.fets import REAL_PARTITION_SIZES

SPLITS = ("train", "val", "test")

pytestmark = pytest.mark.slow


def test_lint_is_clean():
    result = run_snakemake("--lint")
    assert "Congratulations" in result.stdout + result.stderr


def test_bad_config_fails_naming_the_key(tmp_path):
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    config["fets"]["grid"][0]["eps"] = [0, "inf"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_snakemake(
        "-n", "--configfile", str(path), "--directory", str(tmp_path), check=False
    )
    assert result.returncode != 0
    assert "['fets']['grid'][0]['eps'][0]" in result.stdout + result.stderr


def _digests(root: Path, names: tuple[str, ...]) -> dict[str, str]:
    """sha256 of every file at or below the given paths (relative to `root`)."""
    paths = [root / name for name in names]
    files = [q for p in paths for q in ([p] if p.is_file() else sorted(p.rglob("*")))]
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in files
        if p.is_file()
    }


def test_data_stage_is_byte_identical_across_runs(smoke_run, tmp_path):
    again = tmp_path / "again"
    run_data_stage(again)
    second = _digests(again, ("data", "results"))
    first = {name: _digests(smoke_run, (name,)).get(name) for name in second}
    assert first == second
    names = set(second)
    for expected in (
        "results/tables/datasets.csv",
        "results/tables/datasets.md",
        "results/tables/datasets.html",
        "results/figures/data_overview.png",
        "results/figures/data_overview.pdf",
        "results/figures/fets_fig1_patients_per_institution.png",
    ):
        assert expected in names


def test_datasets_table_counts(smoke_run):
    table = pd.read_csv(smoke_run / "results/tables/datasets.csv")
    assert set(table["dataset"]) == set(DATASETS)
    # FeTS: subjects of all institutions = the 33 real partition sizes scaled by 0.03, >= 2.
    fets = table[
        (table.dataset == "fets") & (table.unit == "subjects") & (table.institution != "all")
    ]
    expected = sum(max(2, int(n * 0.03 + 0.5)) for n in REAL_PARTITION_SIZES)
    assert fets["count"].sum() == expected
    assert fets["institution"].nunique() == 33
    # MedMNIST: official splits with the configured counts; per-class rows add up to them.
    blood = table[(table.dataset == "bloodmnist") & (table.unit == "images")]
    totals = blood[blood.class_name == "all"].set_index("split")["count"].to_dict()
    per_class = blood[blood.class_name != "all"].groupby("split")["count"].sum().to_dict()
    data = yaml.safe_load(SMOKE_CONFIG.read_text())["data"]
    counts = data["bloodmnist"]["synthetic"]["counts"]
    assert totals == per_class == dict(zip(SPLITS, counts, strict=True))
    assert blood[blood.class_name != "all"]["class_name"].nunique() == 8
    # Duke: the subjects split by the configured fractions (exact for the smoke's 40 subjects,
    # 24/8/8), n_annotated B-scans each.
    duke = table[(table.dataset == "duke") & (table.class_name == "all")]
    subjects = duke[duke.unit == "subjects"].set_index("split")["count"].to_dict()
    images = duke[duke.unit == "images"].set_index("split")["count"].to_dict()
    generated = data["duke"]["synthetic"]
    n = generated["n_subjects"]
    assert subjects == {s: round(f * n) for s, f in zip(SPLITS, data["duke"]["split"], strict=True)}
    assert images == {k: generated["n_annotated"] * v for k, v in subjects.items()}


def test_processed_metadata_names_its_dataset(smoke_run):
    for meta in (smoke_run / "data/processed").glob("*/meta.json"):
        content = json.loads(meta.read_text())
        assert content["dataset"] == meta.parent.name
        assert content["format_version"] == 1


def test_nothing_reruns_after_a_complete_run(smoke_run):
    result = run_snakemake("-n", "--directory", str(smoke_run), "--configfile", str(SMOKE_CONFIG))
    assert "Nothing to be done" in result.stdout + result.stderr


@pytest.mark.parametrize("study", ["seg", "fets", "xcal"])
def test_a_study_can_be_left_out(study, tmp_path):
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    config[study]["grid"] = []
    cells = config["audit"]["cells"]  # an audited cell must be in its study's grid
    config["audit"]["cells"] = [c for c in cells if not c["run"].startswith(f"results/{study}/")]
    path = tmp_path / "one_less.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path))
    jobs = result.stdout
    assert f"results/tables/{study}_" not in jobs and f"{study}_train" not in jobs
    assert all(f"{other}_train" in jobs for other in {"seg", "fets", "xcal"} - {study})
