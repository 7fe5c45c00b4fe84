"""The dataset registry: one entry per dataset, read by the config checks, the data rules and
the studies."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG

from dpmed.config.checks import check_config, load_schema
from dpmed.data.medmnist import medmnist_datasets
from dpmed.data.registry import (
    DATASET_REGISTRY,
    DATASETS,
    FACTS,
    dataset_label,
    datasets_writing,
    eval_classes,
    family_module,
    processed_files,
    study_datasets,
)
from dpmed.errors import ConfigError

SCHEMA = REPO / "config" / "schema.yaml"


def test_the_schema_knows_exactly_the_registered_datasets():
    schema = load_schema(SCHEMA)
    assert list(schema["properties"]["data"]["properties"]) == list(DATASETS)


def test_every_study_dataset_has_every_fact():
    assert all(not entry.missing() for _, entry in DATASET_REGISTRY.items())
    assert study_datasets("seg") == ("duke", "umn", "covidct")
    assert study_datasets("xcal") == ("bloodmnist", "pneumoniamnist", "dermamnist")
    assert study_datasets("fets") == ("fets",)


def test_medmnist_facts_are_the_official_ones():
    # MedMNIST v2 (Yang et al. 2023), Table 1: classes and channels of each flag
    official = {"bloodmnist": (8, 3), "pneumoniamnist": (2, 1), "dermamnist": (7, 3)}
    registered = {
        name: (DATASET_REGISTRY[name].n_classes, DATASET_REGISTRY[name].channels)
        for name in study_datasets("xcal")
    }
    assert registered == official
    assert {n: (i.n_classes, i.channels) for n, i in medmnist_datasets().items()} == official


def test_image_counts_follow_the_split_of_each_unit():
    data = yaml.safe_load(SMOKE_CONFIG.read_text())["data"]
    duke = {"synthetic": {"n_subjects": 10, "n_annotated": 11}, "split": [0.6, 0.2, 0.2]}
    # subjects 10 → 6/2/2 (val and test max(1, round(0.2·10))), 11 B-scans each
    assert DATASET_REGISTRY["duke"].images(duke) == (110, 66)
    covid = {"synthetic": {"n_slices": 7}, "split": [0.6, 0.2, 0.2]}
    assert DATASET_REGISTRY["covidct"].split_images(covid) == [5, 1, 1]
    counts = data["bloodmnist"]["synthetic"]["counts"]
    assert DATASET_REGISTRY["bloodmnist"].images(data["bloodmnist"]) == (sum(counts), counts[0])
    fets = {"synthetic": {"subjects_scale": 0.01}, "val_fraction": 0.5}
    # every one of the 33 collaborators keeps 2 subjects, one of them for validation
    assert DATASET_REGISTRY["fets"].images(fets) == (66, 33)


def test_a_dataset_lacking_a_fact_is_rejected_naming_it(monkeypatch):
    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    entry = DATASET_REGISTRY["covidct"]
    for fact, blank in (("n_classes", {"n_classes": None}), ("images", {"split_unit": None})):
        monkeypatch.setitem(
            DATASET_REGISTRY._entries, "covidct", dataclasses.replace(entry, **blank)
        )
        with pytest.raises(ConfigError, match=rf"data\.covidct.*'covidct' \(seg grid\).*{fact}"):
            check_config(copy.deepcopy(config), SCHEMA)
    assert set(FACTS) >= {"n_classes", "images"}


# A toy COVID-CT-like dataset registered once (before the studies load), then used by a seg
# block: the schema, the wildcard patterns, the checks and the targets take it.
TOY = """
import copy, dataclasses, re, sys, yaml
from dpmed.data.registry import DATASET_REGISTRY
DATASET_REGISTRY.add("toyct", dataclasses.replace(DATASET_REGISTRY["covidct"], label="Toy CT"))
from dpmed.config.checks import check_config
from dpmed.studies import STUDIES
config = yaml.safe_load(open(sys.argv[1]))
config["data"]["toyct"] = copy.deepcopy(config["data"]["covidct"])
config["seg"]["grid"] = [dict(config["seg"]["grid"][0], datasets=["toyct"])]
config.pop("audit", None)  # its cells name duke runs
grid = check_config(config, sys.argv[2])
assert re.fullmatch(STUDIES["seg"].patterns["dataset"], "toyct")
targets = STUDIES["seg"].targets(grid.jobs("seg"))
assert grid.jobs("seg") and all("/toyct/" in t for t in targets if t.startswith("results/seg/"))
print(len(grid.jobs("seg")), "results/figures/seg_clipping_toyct.png" in targets)
"""


def test_a_dataset_registered_once_is_accepted_by_the_schema_spec_and_checks():
    out = subprocess.run(
        [sys.executable, "-c", TOY, str(SMOKE_CONFIG), str(SCHEMA)],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    jobs, figure = out.stdout.split()
    assert int(jobs) > 0 and figure == "True"


def test_scored_classes_are_the_retinal_layers_on_duke_and_every_foreground_class_elsewhere():
    assert eval_classes("duke", 9) == (1, 2, 3, 4, 5, 6, 7)  # background 0 and fluid 8 unscored
    assert eval_classes("umn", 2) == (1,)
    assert eval_classes("covidct", 3) == (1, 2)


def test_processed_files_and_families():
    assert processed_files("fets") == [
        "data/processed/fets/splits.csv",
        "data/processed/fets/meta.json",
    ]
    assert processed_files("umn")[0] == "data/processed/umn/train.npz"
    assert "fets" not in datasets_writing() and "bloodmnist" in datasets_writing()
    assert family_module("duke").__name__ == "dpmed.data.oct"
    assert dataset_label("covidct") == "COVID-19 lung CT"


def test_an_unknown_dataset_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown dataset 'kvasir'.*duke"):
        DATASET_REGISTRY["kvasir"]
