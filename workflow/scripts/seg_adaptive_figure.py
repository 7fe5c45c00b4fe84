"""Rule seg_adaptive_figure: paper 002 Fig. 11 (adaptive v1–v3 vs fixed vs no morphology)."""

from dpmed.logs import log_to
from dpmed.seg.report.adaptive import adaptive_figure

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    adaptive_figure(smk.input.metrics, smk.output[0])
