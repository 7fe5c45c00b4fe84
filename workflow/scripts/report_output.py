"""Every table/figure rule with a `params.writer` (the generated ones of `dpmed.report.outputs`
and the cross-study tables): call the writer it names ("module:function") with the rule's named
inputs (lists of paths; names starting with `_` are dependencies only), its named outputs (the
first file of each, the .png or .csv: the writer adds the .pdf, or the .md and .html) and its
other params."""

import dpmed.studies  # noqa: F401 (a study's package may register its datasets)
from dpmed.logs import log_to
from dpmed.registry import resolve
from dpmed.report.style import set_scale

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    set_scale(smk.config["data"])  # the figures' "synthetic data" mark
    write = resolve(smk.params.writer)
    inputs = {key: list(files) for key, files in smk.input.items() if not key.startswith("_")}
    outputs = {key: files[0] for key, files in smk.output.items()}
    params = {key: value for key, value in smk.params.items() if key != "writer"}
    write(**inputs, **outputs, **params)
