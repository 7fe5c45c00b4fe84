"""Rule datasets_table: results/tables/datasets.csv from every dataset's meta.json."""

import dpmed.studies  # noqa: F401 (a study's package may register its datasets)
from dpmed.logs import log_to
from dpmed.report.data import datasets_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    datasets_table(dict(zip(smk.params.datasets, smk.input.meta, strict=True)), smk.output[0])
