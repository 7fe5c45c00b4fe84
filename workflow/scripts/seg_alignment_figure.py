"""Rule seg_alignment_figure: paper 002 Fig. 7 (gradient cosine per clip rule, dataset × model)."""

from dpmed.logs import log_to
from dpmed.seg.report.alignment import alignment_figure

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    alignment_figure(smk.input.alignment, smk.output[0])
