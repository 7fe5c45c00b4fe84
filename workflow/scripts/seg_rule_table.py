"""Rule seg_rule_table: results/tables/seg_table1_clip_rules.csv (paper 002 Table 1, from the
clipping-rule registry of dpmed.privacy.clipping)."""

from dpmed.logs import log_to
from dpmed.report.style import write_table
from dpmed.seg.report.privacy import clip_rule_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    write_table(clip_rule_table(), smk.output[0])
