"""Rule fets_figure4: Dice and projected convergence score per round (paper 000, Fig. 4)."""

from dpmed.fets.report import figure4
from dpmed.logs import log_to

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    figure4(smk.params.runs, smk.output[0])
