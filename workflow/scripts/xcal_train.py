"""Rule xcal_train: one XCal-FL grid cell → rounds.csv, metrics.json, privacy.json, road.json."""

from pathlib import Path

from dpmed.logs import log_to
from dpmed.xcal.run import run_xcal

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    run_xcal(
        smk.params.processed,
        Path(smk.output.metrics).parent,
        dict(smk.wildcards),
        smk.params.hp,
        smk.params.seed,
        smk.params.device,
        smk.threads,
    )
