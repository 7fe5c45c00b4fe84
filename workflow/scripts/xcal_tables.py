"""Rule xcal_tables: every xcal table from the grid's run folders."""

from pathlib import Path

from dpmed.logs import log_to
from dpmed.xcal.report import write_tables

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    write_tables(
        smk.params.runs, Path(smk.output.tables[0]).parent, Path(smk.output.measured[0]).parent
    )
