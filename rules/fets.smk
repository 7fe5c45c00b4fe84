"""fets study (paper 000): federated DP-SimAgg on FeTS 2022."""

from dpmed.config.grid import job_seed

# Run folders: dpmed.config.grid.STUDIES["fets"].path, spelled out in fets_train.
FETS_FILES = ("rounds.csv", "selection.csv", "metrics.json", "privacy.json", "resources.json")
FETS_RUNS = [job.path for job in GRID.jobs("fets")]


rule fets_train:
    input:
        splits="data/processed/fets/splits.csv",
        meta="data/processed/fets/meta.json",
    output:
        rounds="results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}/rounds.csv",
        selection="results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}/selection.csv",
        metrics="results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}/metrics.json",
        privacy="results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}/privacy.json",
        resources="results/fets/{aggregator}/{dpmode}/eps{eps}/seed{seed}/resources.json",
    params:
        hp=lambda wc: GRID.params("fets", wc),
        seed=lambda wc: job_seed("fets", wc),
        device=config["device"],
    log:
        "logs/fets_train/{aggregator}/{dpmode}/eps{eps}/seed{seed}.log",
    benchmark:
        "benchmarks/fets_train/{aggregator}/{dpmode}/eps{eps}/seed{seed}.tsv"
    threads: TRAIN_THREADS
    resources:
        gpu=GPU,
        mem_mb=32000,
        runtime=1440,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/fets_train.py"


rule fets_tables:
    input:
        expand("{run}/{name}", run=FETS_RUNS, name=FETS_FILES),
    output:
        reported("results/tables/fets_table2", TAB, "fets_table2", FETS_CAT, "Table II"),
        reported("results/measured/fets_resources", TAB, "fets_resources", FETS_CAT, "Table II"),
        reported("results/tables/fets_privacy", TAB, "fets_privacy", FETS_CAT, "sound vs paper"),
    params:
        runs=FETS_RUNS,
    log:
        "logs/fets_tables.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/fets_tables.py"


rule fets_figure3:
    input:
        # Lambdas: evaluated only when the figure is built, so an empty fets grid still parses.
        selection=lambda wc: f"{FETS_RUNS[0]}/selection.csv",
        splits="data/processed/fets/splits.csv",
    output:
        reported("results/figures/fets_fig3_selection", FIG, "fets_fig3", FETS_CAT, "Fig. 3"),
    params:
        hp=lambda wc: GRID.jobs("fets")[0].params,
        seed=lambda wc: job_seed("fets", GRID.jobs("fets")[0].wc),
    log:
        "logs/fets_figure3.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/fets_figure3.py"


rule fets_figure4:
    input:
        expand("{run}/rounds.csv", run=FETS_RUNS),
    output:
        reported("results/figures/fets_fig4_rounds", FIG, "fets_fig4", FETS_CAT, "Fig. 4"),
    params:
        runs=FETS_RUNS,
    log:
        "logs/fets_figure4.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/fets_figure4.py"


FETS_TARGETS = [
    *expand("{run}/{name}", run=FETS_RUNS, name=FETS_FILES),
    "results/tables/fets_table2.csv",
    "results/measured/fets_resources.csv",
    "results/tables/fets_privacy.csv",
    "results/figures/fets_fig3_selection.png",
    "results/figures/fets_fig4_rounds.png",
]
if not FETS_RUNS:  # the fets grid is empty: no study outputs to build
    FETS_TARGETS = []
STUDY_TARGETS.extend(FETS_TARGETS)


rule fets_results:
    input:
        FETS_TARGETS,


localrules:
    fets_tables,
    fets_figure3,
    fets_figure4,
    fets_results,
