"""Rule seg_train: train one seg cell and write its outputs (dpmed.seg.run.train_seg)."""

from pathlib import Path

from dpmed.logs import log_to
from dpmed.seg.run import train_seg

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    train_seg(
        smk.params.processed,
        Path(smk.output.metrics).parent,
        dict(smk.wildcards.items()),
        smk.params.hp,
        smk.params.seed,
        device=smk.params.device,
        threads=smk.threads,
    )
