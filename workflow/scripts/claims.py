"""Rule claims: results/tables/claims.csv (+ .md, .html), which of each paper's claims the run
supports, results/tables/claims_counts.csv, its verdicts counted per paper (the report front
page), and results/measured/claims_measured.csv, its wall-clock claims (`dpmed.report.claims`)."""

from dpmed.logs import log_to
from dpmed.report.claims import claims_tables, study_claims, verdict_counts
from dpmed.report.style import write_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    studies = {
        study: study_claims(
            reader,
            {
                key.removeprefix(f"{study}__"): list(files)
                for key, files in smk.input.items()
                if key.startswith(f"{study}__")
            },
        )
        for study, reader in smk.params.readers.items()
    }
    claims, measured = claims_tables(studies, smk.params.shown)
    write_table(claims, smk.output.claims[0], links="evidence")
    write_table(verdict_counts(claims, smk.params.config_name), smk.output.counts[0])
    write_table(measured, smk.output.measured[0], links="evidence")
