"""Rule seg_main_table: results/tables/seg_main_{dataset}.csv (paper 002 Table 3 layout)."""

from dpmed.logs import log_to
from dpmed.seg.report.main import write_main_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    write_main_table(smk.input, smk.wildcards.dataset, smk.output[0])
