"""Rule privacy_summary: results/tables/privacy_summary.csv (+ .md, .html), every DP run of all
studies with its mechanism, adjacency, sampling, accountant, ε, δ and guarantee, and the
empirical audit's lower bound and violation flag where the run was audited."""

import dpmed.studies  # noqa: F401 (a study's package may register its datasets)
from dpmed.logs import log_to
from dpmed.report.privacy_summary import privacy_summary
from dpmed.report.style import write_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    write_table(privacy_summary(smk.input.privacy, smk.input.audits), smk.output[0])
