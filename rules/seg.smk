"""seg study (paper 002): DP-SGD clipping rules × DP-Morph segmentation.

seg_train runs one cell {dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}; its checkpoint
(checkpoint.pt in the job folder) is not an output: a killed job resumes from it and it is
deleted once the outputs are written. Tables and figures read only the cells the grid ran.
"""

from dpmed.config.grid import STUDIES, job_seed
from dpmed.seg.outputs import FIGURES as SEG_FIGURES, RUN_FILES as SEG_RUN_FILES

SEG_PATH = STUDIES["seg"].path
SEG_DATASETS = [d for d in SEG_FIGURES if any(j.wc["dataset"] == d for j in GRID.jobs("seg"))]
SEG_METRICS = {
    d: [f"{j.path}/metrics.json" for j in GRID.jobs("seg") if j.wc["dataset"] == d]
    for d in SEG_DATASETS
}


rule seg_train:
    input:
        lambda wc: processed_files(wc.dataset),
    output:
        metrics=f"{SEG_PATH}/metrics.json",
        history=f"{SEG_PATH}/history.csv",
        morph_log=f"{SEG_PATH}/morph_log.csv",
        privacy=f"{SEG_PATH}/privacy.json",
        model=f"{SEG_PATH}/model.pt",
    wildcard_constraints:
        dataset="duke|umn|covidct",
    params:
        processed=lambda wc: f"data/processed/{wc.dataset}",
        hp=lambda wc: GRID.params("seg", wc),
        seed=lambda wc: job_seed("seg", wc),
        device=config["device"],
    log:
        "logs/seg_train/{dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}.log",
    benchmark:
        "benchmarks/seg_train/{dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}.tsv"
    threads: TRAIN_THREADS
    resources:
        gpu=GPU,
        mem_mb=16000,
        runtime=720,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_train.py"


rule seg_main_table:
    input:
        lambda wc: SEG_METRICS[wc.dataset],
    output:
        multiext("results/tables/seg_main_{dataset}", ".csv", ".md"),
    wildcard_constraints:
        dataset="duke|umn|covidct",
    log:
        "logs/seg_main_table/{dataset}.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_table.py"


rule seg_clipping_figure:
    input:
        lambda wc: SEG_METRICS[wc.dataset],
    output:
        multiext("results/figures/seg_{fig}_{dataset}", ".png", ".pdf"),
    wildcard_constraints:
        fig="fig3|fig4|fig5",
        dataset="duke|umn|covidct",
    log:
        "logs/seg_clipping_figure/{fig}_{dataset}.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_figure.py"


rule seg_training_time_figure:
    input:
        [f for d in SEG_DATASETS for f in SEG_METRICS[d]],
    output:
        multiext("results/figures/seg_fig8_training_time", ".png", ".pdf"),
    log:
        "logs/seg_training_time_figure.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_time_figure.py"


SEG_TARGETS = (
    [f"{j.path}/{name}" for j in GRID.jobs("seg") for name in SEG_RUN_FILES]
    + [f"results/tables/seg_main_{d}.csv" for d in SEG_DATASETS]
    + [f"results/figures/{SEG_FIGURES[d]}.png" for d in SEG_DATASETS]
    + (["results/figures/seg_fig8_training_time.png"] if SEG_DATASETS else [])
)
STUDY_TARGETS.extend(SEG_TARGETS)


rule seg_results:
    input:
        SEG_TARGETS,


localrules:
    seg_main_table,
    seg_clipping_figure,
    seg_training_time_figure,
    seg_results,
