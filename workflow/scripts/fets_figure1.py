"""Rule fets_figure1: patients per institution (paper 000, Fig. 1)."""

from pathlib import Path

from dpmed.logs import log_to
from dpmed.report.data import fets_patients_per_institution

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    fets_patients_per_institution(Path(smk.input[0]).parent, smk.output[0])
