"""Rule demo_summary: results/demo_summary.md, the demo's targets met or not and its measured
tables, and results/tables/demo_summary.csv (+ .md, .html), the target table
(`dpmed.report.demo_summary`)."""

from dpmed.logs import log_to
from dpmed.report.demo_summary import write_demo_summary

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    inputs = {key: list(files) for key, files in smk.input.items()}
    write_demo_summary(inputs, smk.output.summary, smk.output.targets[0])
