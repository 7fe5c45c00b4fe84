"""Rule seg_train: train one seg cell and write its outputs (dpmed.seg.run)."""

from dpmed.logs import log_to
from dpmed.runtime import job_from_snakemake
from dpmed.seg.run import run

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    run(job_from_snakemake(snakemake))  # noqa: F821
