"""Rule seg_clipping_figure: paper 002 Figs. 3–5 (clipping × morphology per dataset/model)."""

from dpmed.logs import log_to
from dpmed.seg.report.main import clipping_figure

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    clipping_figure(smk.input, smk.wildcards.dataset, smk.output[0])
