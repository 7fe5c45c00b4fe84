"""Rule data_overview: one sample and its mask per dataset."""

import dpmed.studies  # noqa: F401 (a study's package may register its datasets)
from dpmed.logs import log_to
from dpmed.report.data import data_overview

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    folders = {name: f"data/processed/{name}" for name in smk.params.datasets}
    data_overview(folders, smk.output[0])
