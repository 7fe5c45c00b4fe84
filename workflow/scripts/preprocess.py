"""Rules preprocess / preprocess_fets: raw folder → data/processed/<dataset>/."""

from pathlib import Path

import dpmed.studies  # noqa: F401 (a study's package may register its datasets)
from dpmed.data.stage import preprocess
from dpmed.logs import log_to

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    out_dir = Path(smk.output[0]).parent
    preprocess(out_dir.name, smk.params.cfg, smk.input.raw, out_dir)
