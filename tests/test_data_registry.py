"""The dataset registry: one entry per dataset, read by the config checks, the data rules and
the studies."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from dpmed.data.registry import (
    DATASET_REGISTRY,
    DATASETS,
    dataset_label,
    datasets_writing,
    eval_classes,
    family_module,
    processed_files,
)


def test_the_schema_knows_exactly_the_registered_datasets():
    schema = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())
    assert list(schema["properties"]["data"]["properties"]) == list(DATASETS)


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
