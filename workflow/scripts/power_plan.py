"""Rule power_plan: results/tables/power_plan.csv (+ .md, .html), the seeds each claim needs
for 80 % power and their compute on the paper config's grid (`dpmed.report.power`), from the
claims rule's paired differences."""

from dpmed.config.checks import checked_configs
from dpmed.logs import log_to
from dpmed.report.power import power_plan
from dpmed.report.style import write_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    _, target, grid = checked_configs("dpmed.report.power", None, [str(smk.params.target)])
    write_table(power_plan(smk.input.pairs, target, grid), smk.output[0])
