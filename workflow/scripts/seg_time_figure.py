"""Rule seg_training_time_figure: paper 002 Fig. 8 (training time per model and clipping)."""

from dpmed.logs import log_to
from dpmed.seg.report.main import training_time_figure

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    training_time_figure(smk.input, smk.output[0])
