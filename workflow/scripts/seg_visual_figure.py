"""Rule seg_visual_figure: paper 002 Fig. 6 (predictions per clip rule, one row per dataset)."""

from dpmed.logs import log_to
from dpmed.seg.report.visual import visual_figure

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    visual_figure(smk.input.models, dict(smk.params.processed), dict(smk.params.hp), smk.output[0])
