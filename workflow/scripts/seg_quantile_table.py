"""Rule seg_quantile_table: paper 002 Table 2 (Δ val Dice of adaptive quantile thresholds)."""

from dpmed.logs import log_to
from dpmed.report.style import write_table
from dpmed.seg.report.ablation import quantile_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    write_table(quantile_table(smk.input.metrics, smk.params.quantiles), smk.output[0])
