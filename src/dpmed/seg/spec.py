"""The seg study's `StudySpec` (paper 002), assembled from its grid (`dpmed.seg.grid`) and
outputs (`dpmed.seg.outputs`). A light module: the study registry imports it at parse time."""

from __future__ import annotations

from dpmed.config.study import ClaimSource, StudyAudit, StudySpec
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
    schema="dpmed.seg:schema.yaml",
    rules="rules/seg.smk",
    sizing="dpmed.seg.sizing:SIZING",
    probe="dpmed.seg.probe:PROBE",
    audit=StudyAudit(("gradient", "input", "paper-noise"), "dpmed.seg.audit:audit_cell"),
    claims=ClaimSource("dpmed.seg.claims:seg_observations", outputs.claims_inputs),
    choices=grid.CHOICES,
)
