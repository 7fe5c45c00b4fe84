"""The seg study's `StudySpec` (paper 002), assembled from its grid (`dpmed.seg.grid`) and
outputs (`dpmed.seg.outputs`). A light module: the study registry imports it at parse time."""

from __future__ import annotations

from dpmed.config.study import StudySpec
from dpmed.seg import grid, outputs

SPEC = StudySpec(
    name="seg",
    path="results/seg/{dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}",
    axes=grid.AXES,
    patterns=grid.PATTERNS,
    invalid=grid.invalid,
    run_files=outputs.RUN_FILES,
    targets=outputs.targets,
    category="seg (paper 002)",
    sweep=grid.sweep,
    wildcard_params=grid.wildcard_params,
    check=grid.check_config,
    switches=grid.SWITCHES,
    reports=outputs.REPORTS,
    notes=outputs.notes,
    paired=("dataset", "model", "seed"),
    audit_settings=("gradient", "input", "paper-noise"),
    claims=outputs.claims_inputs,
    choices=grid.CHOICES,
)
