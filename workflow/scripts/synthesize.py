"""Rule synthesize: write synthetic raw data for one dataset in its public raw format."""

import dpmed.studies  # noqa: F401 (a study's package may register its datasets)
from dpmed.data.stage import synthesize
from dpmed.logs import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    synthesize(snakemake.wildcards.dataset, snakemake.params.cfg, snakemake.output[0])  # noqa: F821
