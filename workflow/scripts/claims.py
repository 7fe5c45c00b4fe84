"""Rule claims (`dpmed.report.claims`): results/tables/claims.csv (+ .md, .html), one verdict
per paper claim; claims_cells, the per-cell evidence behind it; claims_pairs.csv, the paired
seeds the power planner reads; claims_counts, the claims counted per paper and verdict (the
report front page); and results/measured/claims_measured (+ _cells, _pairs), the wall-clock
claims."""

from dpmed.logs import log_to
from dpmed.registry import resolve
from dpmed.report.claims import claims_tables, verdict_counts
from dpmed.report.style import SCALE, set_scale, write_table

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    # each study's (claims, observations): its reader ("module:function") called with its
    # named input lists
    studies = {
        study: resolve(reader)(**{
            key.removeprefix(f"{study}__"): list(files)
            for key, files in smk.input.items()
            if key.startswith(f"{study}__")
        })
        for study, reader in smk.params.readers.items()
    }  # fmt: skip
    tables = claims_tables(studies, smk.params.shown)
    set_scale(smk.config["data"])  # every verdict says the scale of the run it comes from
    for frame in (tables.claims, tables.measured):
        frame.insert(3, "scale", SCALE["tag"] or "real data")
    write_table(tables.claims, smk.output.claims[0], links="evidence")
    write_table(tables.cells, smk.output.cells[0], links="evidence")
    write_table(tables.pairs, smk.output.pairs[0])
    tables.measured_pairs.to_csv(smk.output.measured_pairs, index=False)
    counts = verdict_counts(tables.claims, tables.cells, smk.params.config_name)
    counts.insert(2, "scale", SCALE["tag"] or "real data")
    write_table(counts, smk.output.counts[0])
    write_table(tables.measured, smk.output.measured[0], links="evidence")
    write_table(tables.measured_cells, smk.output.measured_cells[0], links="evidence")
    print(counts.to_string(index=False))
