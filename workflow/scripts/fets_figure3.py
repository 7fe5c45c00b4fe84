"""Rule fets_figure3: the three collaborator selection strategies (paper 000, Fig. 3)."""

from dpmed.fets.report import figure3_from_run
from dpmed.logs import log_to

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    figure3_from_run(
        smk.input.selection, smk.input.splits, smk.params.hp, smk.params.seed, smk.output[0]
    )
