"""fets study (paper 000): federated DP-SimAgg on FeTS 2022.

fets_train runs one cell {aggregator}/{dpmode}/eps{eps}/seed{seed}; its checkpoint
(checkpoint.pt in the job folder) is not an output: a killed job resumes from it and it is
deleted once the outputs are written. Run files, wildcard patterns and log paths come from the
study spec (dpmed.fets.spec); its tables and figures are entries of `dpmed.fets.outputs.REPORTS`,
generated as rules by rules/report.smk.
"""

from dpmed.config.grid import job_seed
from dpmed.data.registry import processed_files
from dpmed.fets.spec import SPEC as FETS


rule fets_train:
    input:
        processed_files("fets"),
    output:
        **{name.partition(".")[0]: f"{FETS.path}/{name}" for name in FETS.run_files},
    wildcard_constraints:
        **FETS.patterns,
    params:
        runner="dpmed.fets.run:run",
        processed=lambda wc: "data/processed/fets",
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
        mem_mb=job_mem_mb("fets_train"),
        runtime=job_runtime("fets_train"),
    conda:
        STUDY_CONDA_ENV
    script:
        JOB_SCRIPT


rule fets_results:
    input:
        FETS.targets(GRID.jobs("fets")),
    localrule: True
