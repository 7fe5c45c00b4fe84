"""Rule fets_figure1: patients per institution (paper 000, Fig. 1)."""

from pathlib import Path

from dpmed.fets.report import figure1
from dpmed.logs import log_to

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    figure1(Path(smk.input[0]).parent, smk.output[0])
