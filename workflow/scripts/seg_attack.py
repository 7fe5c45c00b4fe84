"""Rule seg_attack: global-loss membership attack on one trained seg run (dpmed.seg.attack);
attack.json goes beside the run's model.pt."""

from dpmed.logs import log_to
from dpmed.runtime import job_from_snakemake
from dpmed.seg.attack import run_attack

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    run_attack(job_from_snakemake(snakemake))  # noqa: F821
