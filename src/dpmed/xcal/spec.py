"""The xcal study's `StudySpec` (paper 001), assembled from its grid (`dpmed.xcal.grid`) and
outputs (`dpmed.xcal.outputs`). A light module: the study registry imports it at parse time."""

from __future__ import annotations

from dpmed.config.study import StudySpec
from dpmed.xcal import grid, outputs

SPEC = StudySpec(
    name="xcal",
    path="results/xcal/{dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed}",
    axes=grid.AXES,
    patterns=grid.PATTERNS,
    invalid=grid.invalid,
    run_files=outputs.RUN_FILES,
    targets=outputs.targets,
    category="xcal (paper 001)",
    check=grid.check_config,
    reports=outputs.REPORTS,
    paired=("dataset", "model", "shift", "clients", "seed"),
    claims=outputs.claims_inputs,
    audit_settings=("gradient", "input"),
    choices=grid.CHOICES,
)
