"""Names of the seg study's outputs and which runs feed the paper's main tables (a light
module: the rule file imports it at parse time)."""

import re

from dpmed.config.wildcards import SEG_CLIPS

# Files every seg_train job writes into its folder (checkpoint.pt is not among them: it is
# only there while a job runs or after it was killed).
RUN_FILES = (
    "metrics.json",
    "history.csv",
    "morph_log.csv",
    "alignment.csv",
    "privacy.json",
    "model.pt",
)
# Paper 002 Figs. 3–5: the clipping × morphology figure of each dataset.
FIGURES = {"duke": "seg_fig3_duke", "umn": "seg_fig4_umn", "covidct": "seg_fig5_covidct"}

_PAPER_MORPH = re.compile(r"^(?:none|(?:open|close|both)-k[35]|adaptive-v[123])$")


def is_paper_cell(wildcards: dict[str, str]) -> bool:
    """A cell of the paper's main grid (Table 3, Figs. 3–5, 8): a plain clip rule and a morph
    without the ablation suffixes (lr × C sweep, quantiles, per-image scope)."""
    return wildcards["clip"] in SEG_CLIPS and bool(_PAPER_MORPH.match(wildcards["morph"]))
