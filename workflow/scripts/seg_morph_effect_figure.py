"""Rule seg_morph_effect_figure: paper 002 Fig. 10 (prediction before/after morphology and the
improved map, one row per dataset)."""

from dpmed.logs import log_to
from dpmed.seg.report.visual import morph_effect_figure

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    morph_effect_figure(
        smk.input.models, dict(smk.params.processed), dict(smk.params.hp), smk.output[0]
    )
