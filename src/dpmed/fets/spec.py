"""The fets study's `StudySpec` (paper 000), assembled from its grid (`dpmed.fets.grid`) and
outputs (`dpmed.fets.outputs`). The study registry imports it at parse time, so it imports no
torch, pandas or matplotlib."""

from __future__ import annotations

from dpmed.config.study import StudySpec
from dpmed.fets import grid, outputs

SPEC = StudySpec(
    name="fets",
    path="results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}",
    axes=grid.AXES,
    patterns=grid.PATTERNS,
    invalid=grid.invalid,
    run_files=outputs.RUN_FILES,
    targets=outputs.targets,
    category="fets (paper 000)",
    check=grid.check_config,
    sweep=grid.sweep,
    wildcard_params=grid.wildcard_params,
    reports=outputs.REPORTS,
    paired=grid.PAIRED,
    claims=outputs.claims_inputs,
    audit_settings=("update",),
    choices=grid.CHOICES,
)
