"""Names of the seg study's outputs (light module: the rule file imports it at parse time)."""

# Files every seg_train job writes into its folder (checkpoint.pt is not among them: it is
# only there while a job runs or after it was killed).
RUN_FILES = ("metrics.json", "history.csv", "morph_log.csv", "privacy.json", "model.pt")
# Paper 002 Figs. 3–5: the clipping × morphology figure of each dataset.
FIGURES = {"duke": "seg_fig3_duke", "umn": "seg_fig4_umn", "covidct": "seg_fig5_covidct"}
