"""Rule xcal_figures: every xcal figure from the grid's run folders."""

from pathlib import Path

from dpmed.logs import log_to
from dpmed.xcal.report import write_figures

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    write_figures(smk.params.runs, Path(smk.output[0]).parent)
