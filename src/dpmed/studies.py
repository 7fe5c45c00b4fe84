"""The registry of studies: name → `StudySpec`. The generic grid, the wildcard constraints,
the rule files, the job sizing, the preflight, the privacy audit and the reports iterate over
it. A study is its package `dpmed.<study>` and one line below; its parts are found there by
name: `spec:SPEC` (required), `schema.yaml` and `rules.smk` (its config section and rules),
`captions/<caption>.rst` (its report captions), and the optional `sizing:SIZING`,
`probe:PROBE`, `audit:audit_cell` (`study_part`) and `claims:study_observations`
(`claims_reader`)."""

from __future__ import annotations

import importlib.util
from typing import Any

from dpmed.config.study import StudySpec
from dpmed.registry import Registry, resolve

STUDY_NAMES = (
    "seg",
    "fets",
    "xcal",
)

STUDIES: Registry[StudySpec] = Registry("study")
for _name in STUDY_NAMES:
    STUDIES.add(_name, resolve(f"dpmed.{_name}.spec:SPEC"))


def part_module(study: str, part: str) -> str | None:
    """`dpmed.<study>.<part>` when registered study `study` has that module (found, not
    imported), else None (an optional part: sizing, probe, audit)."""
    module = f"dpmed.{STUDIES[study].name}.{part}"
    return module if importlib.util.find_spec(module) else None


def study_part(study: str, part: str, attribute: str) -> Any | None:
    """`attribute` of the module `dpmed.<study>.<part>`, imported now; None when the study has
    no such module."""
    module = part_module(study, part)
    return None if module is None else resolve(f"{module}:{attribute}")


def claims_reader(study: str) -> str:
    """The claims reader of `study` as "module:function",
    `dpmed.<study>.claims:study_observations` (imported only by the claims rule)."""
    return f"dpmed.{STUDIES[study].name}.claims:study_observations"
