"""Rule seg_privacy_table: results/tables/seg_privacy.csv, the sound recipe's σ and ε (RDP, PRV)
beside the paper's recipe per private seg configuration (REFERENCE.md §4 items 6–7)."""

from dpmed.logs import log_to
from dpmed.report.style import write_table
from dpmed.seg.report.privacy import seg_privacy_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    write_table(seg_privacy_table(smk.input.privacy), smk.output[0])
