"""seg study (paper 002): DP-SGD clipping rules × DP-Morph segmentation.

seg_train runs one cell {dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}; its checkpoint
(checkpoint.pt in the job folder) is not an output: a killed job resumes from it and it is
deleted once the outputs are written. seg_attack scores one trained model with the global-loss
membership attack. The tables and figures are entries of `dpmed.seg.outputs.REPORTS`, generated
as rules by rules/report.smk: they read only the cells the grid ran (the paper's main
tables/figures, Table 3, Figs. 3–5, 8, its main cells; the ablation outputs, Fig. 2 and
Table 2, the sweep/quantile cells; the analyses, Figs. 6, 7, 9–12 and the privacy tables,
every cell).
"""

from dpmed.config.grid import job_seed
from dpmed.seg.outputs import ATTACK_FILE as SEG_ATTACK_FILE
from dpmed.seg.spec import SPEC as SEG

SEG_JOBS = GRID.jobs("seg")


rule seg_train:
    input:
        lambda wc: processed_files(wc.dataset),
    output:
        **{name.partition(".")[0]: f"{SEG.path}/{name}" for name in SEG.run_files},
    wildcard_constraints:
        **SEG.patterns,
    params:
        runner="dpmed.seg.run:run",
        processed=lambda wc: f"data/processed/{wc.dataset}",
        hp=lambda wc: GRID.params("seg", wc),
        seed=lambda wc: job_seed("seg", wc),
        device=config["device"],
    log:
        SEG.log("seg_train"),
    benchmark:
        SEG.log("seg_train", "tsv")
    group:
        "seg_cell"  # bundled per SLURM job by the workflow profile (group-components)
    threads: TRAIN_THREADS
    resources:
        gpu=GPU,
        mem_mb=job_mem_mb("seg_train"),
        runtime=job_runtime("seg_train"),
    conda:
        STUDY_CONDA_ENV
    script:
        JOB_SCRIPT


rule seg_attack:
    input:
        data=lambda wc: processed_files(wc.dataset),
        model=f"{SEG.path}/model.pt",
    output:
        attack=f"{SEG.path}/{SEG_ATTACK_FILE}",
    wildcard_constraints:
        **SEG.patterns,
    params:
        runner="dpmed.seg.attack:run_attack",
        processed=lambda wc: f"data/processed/{wc.dataset}",
        hp=lambda wc: GRID.params("seg", wc),
        seed=lambda wc: job_seed("seg", wc),
        device=config["device"],
    log:
        SEG.log("seg_attack"),
    benchmark:
        SEG.log("seg_attack", "tsv")
    group:
        "seg_cell"  # bundled per SLURM job by the workflow profile (group-components)
    threads: TRAIN_THREADS
    resources:
        gpu=GPU,
        mem_mb=job_mem_mb("seg_attack"),
        runtime=job_runtime("seg_attack"),
    conda:
        STUDY_CONDA_ENV
    script:
        JOB_SCRIPT


rule seg_results:
    input:
        SEG.targets(SEG_JOBS),
    localrule: True
