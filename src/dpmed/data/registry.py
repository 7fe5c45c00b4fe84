"""The dataset registry: dataset name → its family module (generator, loader, preprocessing),
display label, the synthetic config keys it needs, and the files its preprocessing writes.

Family modules are imported lazily so a job only pays for the libraries of its own family;
reading the registry imports nothing heavy.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from dpmed.registry import Registry

ARRAY_FILES = ("train.npz", "val.npz", "test.npz", "meta.json")


@dataclass(frozen=True)
class DatasetEntry:
    """A registered dataset.

    Args:
        family: module name under `dpmed.data` (loader) and `dpmed.data.synthetic` (generator).
        label: the name papers and figures use.
        synthetic_keys: the keys its `data.<name>.synthetic` config block must give.
        privacy_unit: what one record of the DP adjacency is in this dataset, and what that
            means for a patient (written to every run's privacy.json).
        processed: the files (relative to `data/processed/<name>/`) preprocessing writes.
        eval_classes: segmentation classes scored by Dice/HD95; None: every foreground class.
    """

    family: str
    label: str
    synthetic_keys: tuple[str, ...]
    privacy_unit: str
    processed: tuple[str, ...] = ARRAY_FILES
    eval_classes: tuple[int, ...] | None = None


# A guarantee for one record covers a patient with k records only through group privacy:
# (k·ε, k·e^((k−1)ε)·δ) for (ε, δ)-DP, which is vacuous for the ε of these studies.
_GROUP = "a patient with k {items} is protected only by group privacy, (k·ε, k·e^((k−1)·ε)·δ)"
DATASET_REGISTRY: Registry[DatasetEntry] = Registry("dataset")
DATASET_REGISTRY.add(
    "fets",
    DatasetEntry(
        "fets",
        "FeTS 2022",
        ("shape", "subjects_scale"),
        "one collaborator (an institution with all its patients' scans): every patient of an "
        "institution is covered by the guarantee",
        ("splits.csv", "meta.json"),
    ),
)
# Duke: the seven retinal layers (paper 002 §4.3: background and fluid are not scored).
DATASET_REGISTRY.add(
    "duke",
    DatasetEntry(
        "oct",
        "Duke",
        ("shape", "n_subjects", "n_bscans", "n_annotated"),
        "one annotated B-scan; a Duke patient has 11 annotated B-scans, and "
        + _GROUP.format(items="B-scans (k = 11)"),
        eval_classes=tuple(range(1, 8)),
    ),
)
DATASET_REGISTRY.add(
    "umn",
    DatasetEntry(
        "oct",
        "UMN",
        ("shape", "n_subjects", "n_bscans"),
        "one B-scan; a UMN patient has 25 B-scans, and " + _GROUP.format(items="B-scans (k = 25)"),
    ),
)
DATASET_REGISTRY.add(
    "covidct",
    DatasetEntry(
        "covid_ct",
        "COVID-19 lung CT",
        ("shape", "n_slices"),
        "one axial CT slice; slices of one patient are not grouped, and "
        + _GROUP.format(items="slices"),
    ),
)
for _name, _label, _item in (
    ("bloodmnist", "BloodMNIST", "one blood-cell image"),
    ("pneumoniamnist", "PneumoniaMNIST", "one chest X-ray"),
    ("dermamnist", "DermaMNIST", "one dermatoscopic image"),
):
    DATASET_REGISTRY.add(
        _name,
        DatasetEntry(
            "medmnist",
            _label,
            ("counts",),
            f"{_item}; images are not grouped by patient, and " + _GROUP.format(items="images"),
        ),
    )

DATASETS: tuple[str, ...] = DATASET_REGISTRY.names()


def datasets_writing(files: tuple[str, ...] = ARRAY_FILES) -> tuple[str, ...]:
    """The datasets whose preprocessing writes exactly `files` (default: the array splits)."""
    return tuple(n for n, entry in DATASET_REGISTRY.items() if entry.processed == files)


def eval_classes(dataset: str, n_classes: int) -> tuple[int, ...]:
    """The classes a segmentation of `dataset` with `n_classes` labels is scored on."""
    return DATASET_REGISTRY[dataset].eval_classes or tuple(range(1, n_classes))


def privacy_unit(dataset: str) -> str:
    """What one record of the DP adjacency is in `dataset`, and what it means for a patient."""
    return DATASET_REGISTRY[dataset].privacy_unit


def dataset_label(dataset: str) -> str:
    """The display name of `dataset` ("Duke", "BloodMNIST", ...)."""
    return DATASET_REGISTRY[dataset].label


def processed_files(dataset: str) -> list[str]:
    """The files the preprocess rule of `dataset` writes, as paths under data/processed/."""
    return [f"data/processed/{dataset}/{name}" for name in DATASET_REGISTRY[dataset].processed]


def family_module(dataset: str) -> ModuleType:
    """The loader/preprocess module `dpmed.data.<family>` of `dataset`."""
    return importlib.import_module(f"dpmed.data.{DATASET_REGISTRY[dataset].family}")


def generator_module(dataset: str) -> ModuleType:
    """The synthetic generator module `dpmed.data.synthetic.<family>` of `dataset`."""
    return importlib.import_module(f"dpmed.data.synthetic.{DATASET_REGISTRY[dataset].family}")
