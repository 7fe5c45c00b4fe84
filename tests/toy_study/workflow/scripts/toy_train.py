"""Rule toy_train: one run of the toy study."""

from dpmed.toy.run import run

from dpmed.logs import log_to
from dpmed.runtime import job_from_snakemake

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    run(job_from_snakemake(smk))
