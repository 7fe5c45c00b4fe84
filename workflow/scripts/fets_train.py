"""Rule fets_train: one federated run (or its resumption) of the fets study."""

from pathlib import Path

from dpmed.fets.run import run
from dpmed.logs import log_to

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    run(
        processed_dir=Path(smk.input.splits).parent,
        out_dir=Path(smk.output.rounds).parent,
        wildcards=dict(smk.wildcards.items()),
        params=smk.params.hp,
        seed=smk.params.seed,
        device=smk.params.device,
        threads=smk.threads,
    )
