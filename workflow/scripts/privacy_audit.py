"""Rule privacy_audit: retrain one private grid cell with canaries and write its audit.json
(dpmed.audit.audit_cell)."""

from pathlib import Path

from dpmed.audit import audit_cell
from dpmed.logs import log_to
from dpmed.runtime import JobContext

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    job = JobContext(
        processed_dir=Path(smk.params.processed),
        out_dir=Path(smk.output.audit).parent,
        wildcards=smk.params.cell,
        params=smk.params.hp,
        seed=int(smk.params.seed),
        device=smk.params.device,
        threads=smk.threads,
    )
    params = smk.params
    audit_cell(smk.wildcards.study, job, smk.wildcards.setting, params.canaries,
               params.confidence, params.noise_scale)  # fmt: skip
