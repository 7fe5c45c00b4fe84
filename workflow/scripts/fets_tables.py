"""Rule fets_tables: Table II (+ baselines), measured resources, per-round privacy."""

from dpmed.fets.report import write_tables
from dpmed.logs import log_to

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    write_tables(smk.params.runs, smk.output[0], smk.output[2], smk.output[4])
