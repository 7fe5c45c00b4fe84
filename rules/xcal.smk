"""xcal study (paper 001): XCal-FL explainability-calibrated DP noise.

xcal_train runs one cell {dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed} of the
federated grid; its checkpoint (checkpoint.pt in the job folder) is not an output: a killed job
resumes from it and it is deleted once the outputs are written. The table and figure rules read
only the cells the grid ran.
"""

from dpmed.config.grid import job_seed
from dpmed.xcal.report import FIGURES as XCAL_FIGURES
from dpmed.xcal.report import TABLES as XCAL_TABLES, MEASURED_TABLES as XCAL_MEASURED

XCAL_PATH = "results/xcal/{dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed}"
XCAL_RUN_FILES = ("rounds.csv", "metrics.json", "privacy.json", "road.json", "gradcam.npz")
XCAL_RUNS = [job.path for job in GRID.jobs("xcal")]
# Report grouping: the paper (001) has no numbered tables or figures, so its sections.
XCAL_GROUP = {
    "xcal_main": "§6 results",
    "xcal_trajectories": "§6 results",
    "xcal_efficiency": "§6 results",
    "xcal_gradcam": "§6 results",
    "xcal_clients": "§6 clients and shift",
    "xcal_shift": "§6 clients and shift",
    "xcal_clients_shift": "§6 clients and shift",
    "xcal_ablation": "§7 ablation",
    "xcal_runtime": "§8 runtime",
}


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
        tables=[
            f
            for name in XCAL_TABLES
            for f in reported(f"results/tables/{name}", TAB, name, XCAL_CAT, XCAL_GROUP[name])
        ],
        measured=[
            f
            for name in XCAL_MEASURED
            for f in reported(f"results/measured/{name}", TAB, name, XCAL_CAT, XCAL_GROUP[name])
        ],
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
        [
            f
            for name in XCAL_FIGURES
            for f in reported(
                f"results/figures/{name}", FIG, f"{name}_figure", XCAL_CAT, XCAL_GROUP[name]
            )
        ],
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
    + [f"results/measured/{name}.csv" for name in XCAL_MEASURED]
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
