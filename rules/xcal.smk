"""xcal study (paper 001): XCal-FL explainability-calibrated DP noise.

xcal_train runs one cell {dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed} of the
federated grid; its checkpoint (checkpoint.pt in the job folder) is not an output: a killed job
resumes from it and it is deleted once the outputs are written. The table and figure rules read
only the cells the grid ran.
"""

from dpmed.config.grid import job_seed
from dpmed.report.xcal import FIGURES as XCAL_FIGURES
from dpmed.report.xcal import TABLES as XCAL_TABLES

XCAL_PATH = "results/xcal/{dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed}"
XCAL_RUN_FILES = ("rounds.csv", "metrics.json", "privacy.json", "road.json", "gradcam.npz")
XCAL_RUNS = [job.path for job in GRID.jobs("xcal")]


rule xcal_train:
    input:
        lambda wc: processed_files(wc.dataset),
    output:
        rounds=f"{XCAL_PATH}/rounds.csv",
        metrics=f"{XCAL_PATH}/metrics.json",
        privacy=f"{XCAL_PATH}/privacy.json",
        road=f"{XCAL_PATH}/road.json",
        gradcam=f"{XCAL_PATH}/gradcam.npz",
    wildcard_constraints:
        dataset="bloodmnist|pneumoniamnist|dermamnist",
        model="resnet18|efficientnet_b0",
    params:
        processed=lambda wc: f"data/processed/{wc.dataset}",
        hp=lambda wc: GRID.params("xcal", wc),
        seed=lambda wc: job_seed("xcal", wc),
        device=config["device"],
    log:
        "logs/xcal_train/{dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed}.log",
    benchmark:
        "benchmarks/xcal_train/{dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed}.tsv"
    threads: TRAIN_THREADS
    resources:
        gpu=GPU,
        mem_mb=16000,
        runtime=720,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/xcal_train.py"


rule xcal_tables:
    input:
        runs=[f"{run}/{name}" for run in XCAL_RUNS for name in XCAL_RUN_FILES],
    output:
        [f"results/tables/{name}{ext}" for name in XCAL_TABLES for ext in (".csv", ".md")],
    params:
        runs=XCAL_RUNS,
    log:
        "logs/xcal_tables.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/xcal_tables.py"


rule xcal_figures:
    input:
        runs=[f"{run}/{name}" for run in XCAL_RUNS for name in XCAL_RUN_FILES],
    output:
        [f"results/figures/{name}{ext}" for name in XCAL_FIGURES for ext in (".png", ".pdf")],
    params:
        runs=XCAL_RUNS,
    log:
        "logs/xcal_figures.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/xcal_figures.py"


XCAL_TARGETS = (
    [f"{run}/{name}" for run in XCAL_RUNS for name in XCAL_RUN_FILES]
    + [f"results/tables/{name}.csv" for name in XCAL_TABLES]
    + [f"results/figures/{name}.png" for name in XCAL_FIGURES]
    if XCAL_RUNS  # an empty xcal grid builds no xcal tables or figures
    else []
)
STUDY_TARGETS.extend(XCAL_TARGETS)


rule xcal_results:
    input:
        XCAL_TARGETS,


localrules:
    xcal_tables,
    xcal_figures,
    xcal_results,
