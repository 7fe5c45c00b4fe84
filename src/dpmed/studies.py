"""The registry of studies: name → `StudySpec`. The generic grid, the wildcard constraints,
the rule files, the job sizing, the preflight, the privacy audit and the reports iterate over
it. A study is its package (`dpmed.<study>`), its rule file and one line below: the module
holding its `SPEC`."""

from __future__ import annotations

import importlib

from dpmed.config.study import StudySpec
from dpmed.registry import Registry

SPEC_MODULES = (
    "dpmed.seg.spec",
    "dpmed.fets.spec",
    "dpmed.xcal.spec",
)

STUDIES: Registry[StudySpec] = Registry("study")
for _module in SPEC_MODULES:
    _spec = importlib.import_module(_module).SPEC
    STUDIES.add(_spec.name, _spec)
