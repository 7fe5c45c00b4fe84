"""Rule seg_attack: global-loss membership attack on one trained seg run (dpmed.seg.attack)."""

from pathlib import Path

from dpmed.logs import log_to
from dpmed.seg.attack import run_attack

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    run_attack(  # writes attack.json beside model.pt, i.e. smk.output.attack
        smk.params.processed,
        Path(smk.input.model).parent,
        dict(smk.wildcards.items()),
        smk.params.hp,
        smk.params.seed,
        device=smk.params.device,
        threads=smk.threads,
    )
