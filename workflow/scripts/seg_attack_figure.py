"""Rule seg_attack_figure: paper 002 Fig. 9 and its table (dpmed.seg.report.attack)."""

from dpmed.logs import log_to
from dpmed.seg.report.attack import attack_report

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    attack_report(list(smk.input.attack), smk.output.figure[0], smk.output.table[0])
