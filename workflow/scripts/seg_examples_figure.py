"""Rule seg_examples_figure: paper 002 Fig. 1 (example input and ground-truth mask per seg
dataset)."""

from dpmed.logs import log_to
from dpmed.seg.report.visual import examples_figure

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    examples_figure(dict(smk.params.processed), smk.output[0])
