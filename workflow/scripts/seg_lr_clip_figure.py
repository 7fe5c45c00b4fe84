"""Rule seg_lr_clip_figure: paper 002 Fig. 2 (flat-clipping lr × C heatmaps) and its cell table."""

from dpmed.logs import log_to
from dpmed.report.style import write_table
from dpmed.seg.report.ablation import lr_clip_figure

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    cells = lr_clip_figure(smk.input.metrics, smk.output.figure[0])
    write_table(cells, smk.output.table[0])
