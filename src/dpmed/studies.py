"""The registry of studies: name → `StudySpec`. The generic grid, the wildcard constraints,
the privacy summary and the rule files iterate over it."""

from __future__ import annotations

from dpmed.config.study import StudySpec
from dpmed.fets.spec import SPEC as FETS
from dpmed.registry import Registry
from dpmed.seg.spec import SPEC as SEG
from dpmed.xcal.spec import SPEC as XCAL

STUDIES: Registry[StudySpec] = Registry("study")
for _spec in (SEG, FETS, XCAL):
    STUDIES.add(_spec.name, _spec)
