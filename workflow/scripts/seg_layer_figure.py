"""Rule seg_layer_figure: paper 002 Fig. 12 (adaptive v2 layer thickness and layer Dice)."""

from pathlib import Path

from dpmed.logs import log_to
from dpmed.seg.report.adaptive import layer_figure

smk = snakemake  # noqa: F821 (injected by Snakemake)
with log_to(smk.log[0]):
    history_dirs = [Path(p).parent for p in smk.input.history]
    if history_dirs != [Path(p).parent for p in smk.input.morph_log]:
        raise ValueError("history and morph_log inputs must list the same runs in one order")
    layer_figure(history_dirs, smk.output[0])
