"""Rule xcal_train: one XCal-FL grid cell → its run files (`dpmed.xcal.spec.RUN_FILES`)."""

from dpmed.logs import log_to
from dpmed.runtime import job_from_snakemake
from dpmed.xcal.run import run

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    run(job_from_snakemake(smk))
