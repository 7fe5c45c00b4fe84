"""Rule preflight: results/preflight/ (preflight.csv, cost.csv, cost.png and their twins) for
every distinct cell of the grid, or its covering sample; the job fails, naming each failed
cell in logs/preflight.log, when any cell fails (docs/preflight.md)."""

from pathlib import Path

from dpmed.config.grid import Grid
from dpmed.logs import log_to
from dpmed.preflight.run import run_preflight

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    out = Path(smk.output.cells[0]).parent
    failed = run_preflight(smk.config, Grid(smk.config), out, sample=smk.params.sample)
    if len(failed):
        raise SystemExit(f"preflight: {len(failed)} rows failed (listed above)")
