"""Rule job_cost_measured: results/measured/job_cost.csv (+ .md, .html), each training job's
measured wall time and peak memory beside the job-cost model's prediction and its request
(`dpmed.job_cost.beside_measured`)."""

from dpmed.config.grid import Grid
from dpmed.job_cost import beside_measured
from dpmed.logs import log_to
from dpmed.report.style import write_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    frame = beside_measured(smk.config, Grid(smk.config), list(smk.input.benchmarks))
    write_table(frame, smk.output[0])
