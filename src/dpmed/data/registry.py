"""Dataset name → the family module that generates, loads and preprocesses it.

Modules are imported lazily so a job only pays for the libraries of its own family.
"""

from __future__ import annotations

import importlib
from types import ModuleType

FAMILY_OF_DATASET: dict[str, str] = {
    "fets": "fets",
    "duke": "oct",
    "umn": "oct",
    "covidct": "covid_ct",
    "bloodmnist": "medmnist",
    "pneumoniamnist": "medmnist",
    "dermamnist": "medmnist",
}

DATASETS: tuple[str, ...] = tuple(FAMILY_OF_DATASET)


def family_module(dataset: str) -> ModuleType:
    """The loader/preprocess module `dpmed.data.<family>` of `dataset`."""
    return importlib.import_module(f"dpmed.data.{_family(dataset)}")


def generator_module(dataset: str) -> ModuleType:
    """The synthetic generator module `dpmed.data.synthetic.<family>` of `dataset`."""
    return importlib.import_module(f"dpmed.data.synthetic.{_family(dataset)}")


def _family(dataset: str) -> str:
    try:
        return FAMILY_OF_DATASET[dataset]
    except KeyError:
        known = ", ".join(DATASETS)
        raise ValueError(f"unknown dataset '{dataset}' (known: {known})") from None
