"""A study's job rule (e.g. seg_train, seg_attack): the function its `runner` param names
("module:function", e.g. dpmed.seg.run:run) called with the job's context, logged to the rule's
log."""

import dpmed.studies  # noqa: F401 (a study's package may register its datasets)
from dpmed.logs import log_to
from dpmed.registry import resolve
from dpmed.runtime import job_from_snakemake

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    resolve(smk.params.runner)(job_from_snakemake(smk))
