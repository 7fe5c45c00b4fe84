"""xcal study (paper 001): XCal-FL explainability-calibrated DP noise.

xcal_train runs one cell of the federated grid (`dpmed.xcal.spec.SPEC.path`); its checkpoint
(checkpoint.pt in the job folder) is not an output: a killed job resumes from it and it is
deleted once the outputs are written. The table and figure rules read only the cells the grid
ran. Targets, wildcard patterns, run files, table and figure names come from the spec.
"""

from pathlib import Path

from dpmed.config.grid import job_seed
from dpmed.xcal.spec import SPEC as XCAL, REPORT_GROUPS as XCAL_GROUP
from dpmed.xcal.spec import FIGURES as XCAL_FIGURES
from dpmed.xcal.spec import TABLES as XCAL_TABLES, MEASURED_TABLES as XCAL_MEASURED

XCAL_RUNS = [job.path for job in GRID.jobs("xcal")]
XCAL_RUN_OUTPUTS = [f"{run}/{name}" for run in XCAL_RUNS for name in XCAL.run_files]


rule xcal_train:
    input:
        lambda wc: processed_files(wc.dataset),
    output:
        **{Path(name).stem: f"{XCAL.path}/{name}" for name in XCAL.run_files},
    wildcard_constraints:
        **XCAL.patterns,
    params:
        processed=lambda wc: f"data/processed/{wc.dataset}",
        hp=lambda wc: GRID.params("xcal", wc),
        seed=lambda wc: job_seed("xcal", wc),
        device=config["device"],
    log:
        XCAL.log("xcal_train"),
    benchmark:
        XCAL.log("xcal_train", "tsv")
    group:
        "xcal_run"  # bundled per SLURM job by the workflow profile (group-components)
    threads: TRAIN_THREADS
    resources:
        gpu=GPU,
        mem_mb=job_mem_mb("xcal_train"),
        runtime=job_runtime("xcal_train"),
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/xcal_train.py"


rule xcal_tables:
    localrule: True
    input:
        runs=XCAL_RUN_OUTPUTS,
    output:
        tables=[
            f
            for name in XCAL_TABLES
            for f in reported(
                f"results/tables/{name}", TAB, name, XCAL.category, XCAL_GROUP[name]
            )
        ],
        measured=[
            f
            for name in XCAL_MEASURED
            for f in reported(
                f"results/measured/{name}", TAB, name, XCAL.category, XCAL_GROUP[name]
            )
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
    localrule: True
    input:
        runs=XCAL_RUN_OUTPUTS,
    output:
        [
            f
            for name in XCAL_FIGURES
            for f in reported(
                f"results/figures/{name}", FIG, f"{name}_figure", XCAL.category, XCAL_GROUP[name]
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


rule xcal_results:
    localrule: True
    input:
        XCAL.targets(GRID.jobs("xcal")),
