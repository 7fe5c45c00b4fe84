"""fets study (paper 000): federated DP-SimAgg on FeTS 2022.

fets_train runs one cell {aggregator}/{dpmode}/eps{eps}/seed{seed}; its checkpoint
(checkpoint.pt in the job folder) is not an output: a killed job resumes from it and it is
deleted once the outputs are written. Run files, tables, figures, wildcard patterns and log
paths come from the study spec (dpmed.fets.spec).
"""

from dpmed.config.grid import job_seed
from dpmed.data.registry import processed_files
from dpmed.fets.spec import FIGURES as FETS_FIGURES
from dpmed.fets.spec import SPEC as FETS
from dpmed.fets.spec import TABLES as FETS_TABLES
from dpmed.fets.spec import run_targets as fets_run_targets

FETS_RUNS = [job.path for job in GRID.jobs("fets")]


rule fets_train:
    input:
        processed_files("fets"),
    output:
        **{name.partition(".")[0]: f"{FETS.path}/{name}" for name in FETS.run_files},
    wildcard_constraints:
        **FETS.patterns,
    params:
        processed="data/processed/fets",
        hp=lambda wc: GRID.params("fets", wc),
        seed=lambda wc: job_seed("fets", wc),
        device=config["device"],
    log:
        FETS.log("fets_train"),
    benchmark:
        FETS.log("fets_train", "tsv")
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
        fets_run_targets(GRID.jobs("fets")),
    output:
        [
            f
            for name in FETS_TABLES
            for f in reported(
                f"{FETS_TABLES[name].stem}", TAB, name, FETS.category, FETS_TABLES[name].group
            )
        ],
    params:
        runs=FETS_RUNS,
    log:
        "logs/fets_tables.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/fets_tables.py"


rule fets_figure1:
    input:
        "data/processed/fets/splits.csv",
    output:
        reported(
            f"{FETS_FIGURES['fets_fig1'].stem}",
            FIG,
            "fets_fig1",
            FETS.category,
            FETS_FIGURES["fets_fig1"].group,
        ),
    log:
        "logs/fets_figure1.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/fets_figure1.py"


rule fets_figure3:
    input:
        # Lambdas: evaluated only when the figure is built, so an empty fets grid still parses.
        selection=lambda wc: f"{FETS_RUNS[0]}/selection.csv",
        splits="data/processed/fets/splits.csv",
    output:
        reported(
            f"{FETS_FIGURES['fets_fig3'].stem}",
            FIG,
            "fets_fig3",
            FETS.category,
            FETS_FIGURES["fets_fig3"].group,
        ),
    params:
        hp=lambda wc: GRID.jobs("fets")[0].params,
        seed=lambda wc: job_seed("fets", GRID.jobs("fets")[0].wc),
    log:
        "logs/fets_figure3.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/fets_figure3.py"


rule fets_figure4:
    input:
        [f"{run}/rounds.csv" for run in FETS_RUNS],
    output:
        reported(
            f"{FETS_FIGURES['fets_fig4'].stem}",
            FIG,
            "fets_fig4",
            FETS.category,
            FETS_FIGURES["fets_fig4"].group,
        ),
    params:
        runs=FETS_RUNS,
    log:
        "logs/fets_figure4.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/fets_figure4.py"


rule fets_results:
    input:
        FETS.targets(GRID.jobs("fets")),
    localrule: True
