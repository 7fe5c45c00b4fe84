"""The dataset registry: dataset name → its family module (generator, loader, preprocessing),
display label, the synthetic config keys it needs, the files its preprocessing writes, and the
facts the other layers size and build its jobs with (study, classes, input channels, image
counts), so a dataset is registered in this one place.

Family modules are imported lazily so a job only pays for the libraries of its own family;
reading the registry imports nothing heavy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from dpmed.registry import Registry

ARRAY_FILES = ("train.npz", "val.npz", "test.npz", "meta.json")
# The facts every dataset a study grid uses must have (`DatasetEntry.missing`).
FACTS = ("study", "n_classes", "channels", "images")
# (all images, training images) of a dataset from its `data.<name>` config block.
ImageCounts = Callable[[Mapping[str, Any]], tuple[int, int]]


@dataclass(frozen=True)
class MedMNISTInfo:
    """Facts of one MedMNIST flag: classes, channels, official split sizes and the official
    number of TRAIN images per class (used as the class balance of the synthetic data)."""

    flag: str
    title: str
    class_names: tuple[str, ...]
    channels: int
    split_sizes: tuple[int, int, int]
    train_class_counts: tuple[int, ...]

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def train_proportions(self) -> np.ndarray:
        """Official train class frequencies (n_classes,), summing to 1."""
        counts = np.asarray(self.train_class_counts, dtype=np.float64)
        return counts / counts.sum()


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
        study: the study whose grid may use it (`dpmed.studies.STUDIES`).
        n_classes: the labels its networks predict (segmentation: background included).
        channels: input channels of its images.
        split_unit: the synthetic key counting what its `split` divides (subjects, slices);
            None when the config gives no `split`.
        unit_images: the synthetic key giving the images of one split unit (None: one).
        counts: (all, training) images of a dataset without `split_unit`, from its config
            block (MedMNIST: images; FeTS: subjects).
        info: its family's own facts (MedMNIST: `MedMNISTInfo`, class names and the official
            sizes the synthetic data follows).
    A fact left None is one the dataset lacks: `config.checks` rejects a grid that uses it.
    """

    family: str
    label: str
    synthetic_keys: tuple[str, ...]
    privacy_unit: str
    processed: tuple[str, ...] = ARRAY_FILES
    eval_classes: tuple[int, ...] | None = None
    study: str | None = None
    n_classes: int | None = None
    channels: int | None = None
    split_unit: str | None = None
    unit_images: str | None = None
    counts: ImageCounts | None = None
    info: Any = None

    def split_images(self, cfg: Mapping[str, Any]) -> list[int]:
        """Images in train, val and test as preprocessing splits the configured sizes (the
        `synthetic` counts of config/config.yaml are the real datasets' sizes)."""
        from dpmed.data.splits import split_counts  # numpy: only when sizes are asked for

        if self.split_unit is None:
            raise KeyError(f"{self.label} has no split unit")
        synthetic = cfg["synthetic"]
        per = int(synthetic[self.unit_images]) if self.unit_images else 1
        units = split_counts(int(synthetic[self.split_unit]), cfg["split"])
        return [n * per for n in units]

    def images(self, cfg: Mapping[str, Any]) -> tuple[int, int]:
        """(all images, training images) from the dataset's `data.<name>` config block."""
        if self.counts is not None:
            return self.counts(cfg)
        split = self.split_images(cfg)
        return sum(split), split[0]

    def missing(self) -> tuple[str, ...]:
        """The `FACTS` this dataset lacks."""
        known = {
            "study": self.study,
            "n_classes": self.n_classes,
            "channels": self.channels,
            "images": self.counts or self.split_unit,
        }
        return tuple(fact for fact in FACTS if known[fact] is None)


def _fets_counts(cfg: Mapping[str, Any]) -> tuple[int, int]:
    """Subjects of the 33 collaborators and their local training splits (`val_fraction`)."""
    from dpmed.data.splits import split_counts
    from dpmed.data.synthetic.fets import partition_sizes

    sizes = partition_sizes(float(cfg["synthetic"]["subjects_scale"]))
    fractions = [1.0 - float(cfg["val_fraction"]), float(cfg["val_fraction"])]
    return sum(sizes), sum(split_counts(n, fractions)[0] for n in sizes)


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
        study="fets",
        n_classes=4,  # background and the three BraTS tumour labels
        channels=4,  # T1, T1ce, T2, FLAIR
        counts=_fets_counts,
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
        study="seg",
        n_classes=9,
        channels=1,
        split_unit="n_subjects",
        unit_images="n_annotated",
    ),
)
DATASET_REGISTRY.add(
    "umn",
    DatasetEntry(
        "oct",
        "UMN",
        ("shape", "n_subjects", "n_bscans"),
        "one B-scan; a UMN patient has 25 B-scans, and " + _GROUP.format(items="B-scans (k = 25)"),
        study="seg",
        n_classes=2,
        channels=1,
        split_unit="n_subjects",
        unit_images="n_bscans",
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
        study="seg",
        n_classes=2,
        channels=1,
        split_unit="n_slices",
    ),
)
for _info, _item in (
    (
        MedMNISTInfo(
            flag="bloodmnist",
            title="BloodMNIST",
            class_names=(
                "basophil",
                "eosinophil",
                "erythroblast",
                "immature granulocytes",
                "lymphocyte",
                "monocyte",
                "neutrophil",
                "platelet",
            ),
            channels=3,
            split_sizes=(11959, 1712, 3421),
            train_class_counts=(852, 2181, 1085, 2026, 849, 993, 2330, 1643),
        ),
        "one blood-cell image",
    ),
    (
        MedMNISTInfo(
            flag="pneumoniamnist",
            title="PneumoniaMNIST",
            class_names=("normal", "pneumonia"),
            channels=1,
            split_sizes=(4708, 524, 624),
            train_class_counts=(1214, 3494),
        ),
        "one chest X-ray",
    ),
    (
        MedMNISTInfo(
            flag="dermamnist",
            title="DermaMNIST",
            class_names=(
                "actinic keratoses",
                "basal cell carcinoma",
                "benign keratosis-like lesions",
                "dermatofibroma",
                "melanoma",
                "melanocytic nevi",
                "vascular lesions",
            ),
            channels=3,
            split_sizes=(7007, 1003, 2005),
            train_class_counts=(228, 359, 769, 80, 779, 4693, 99),
        ),
        "one dermatoscopic image",
    ),
):
    DATASET_REGISTRY.add(
        _info.flag,
        DatasetEntry(
            "medmnist",
            _info.title,
            ("counts",),
            f"{_item}; images are not grouped by patient, and " + _GROUP.format(items="images"),
            study="xcal",
            n_classes=_info.n_classes,
            channels=_info.channels,
            counts=lambda cfg: (sum(cfg["synthetic"]["counts"]), cfg["synthetic"]["counts"][0]),
            info=_info,
        ),
    )

DATASETS: tuple[str, ...] = DATASET_REGISTRY.names()


def study_datasets(study: str) -> tuple[str, ...]:
    """The datasets registered for `study`, in registration order."""
    return tuple(n for n, entry in DATASET_REGISTRY.items() if entry.study == study)


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
