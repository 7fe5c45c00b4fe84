"""seg study (paper 002): DP-SGD clipping rules × DP-Morph segmentation.

seg_train runs one cell {dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}; its checkpoint
(checkpoint.pt in the job folder) is not an output: a killed job resumes from it and it is
deleted once the outputs are written. seg_attack scores one trained model with the global-loss
membership attack. Tables and figures read only the cells the grid ran: the paper's main
tables/figures (Table 3, Figs. 3–5, 8) its main cells, the ablation outputs (Fig. 2, Table 2)
the sweep/quantile cells, the analyses (Figs. 6, 7, 9–12, privacy tables) every cell.
"""

from dpmed.config.grid import job_seed
from dpmed.studies import STUDIES
from dpmed.seg.spec import FIGURES as SEG_FIGURES, RUN_FILES as SEG_RUN_FILES, is_paper_cell

SEG_PATH = STUDIES["seg"].path
SEG_JOBS = GRID.jobs("seg")
SEG_RUNS = [j.path for j in SEG_JOBS]
SEG_DATASETS = [d for d in SEG_FIGURES if any(j.wc["dataset"] == d for j in SEG_JOBS)]
SEG_METRICS = {
    d: [f"{j.path}/metrics.json" for j in SEG_JOBS if j.wc["dataset"] == d and is_paper_cell(j.wc)]
    for d in SEG_DATASETS
}
SEG_MAIN_DATASETS = [d for d in SEG_DATASETS if SEG_METRICS[d]]
SEG_PRIVATE_RUNS = [j.path for j in SEG_JOBS if j.wc["eps"] != "inf"]
SEG_HAS = {
    "sweep": any("-C" in j.wc["clip"] for j in SEG_JOBS),
    "quantiles": any("-q" in j.wc["morph"] for j in SEG_JOBS),
    "adaptive": any(
        j.wc["morph"].startswith("adaptive") and j.wc["dataset"] == "duke" for j in SEG_JOBS
    ),
}


rule seg_train:
    input:
        lambda wc: processed_files(wc.dataset),
    output:
        metrics=f"{SEG_PATH}/metrics.json",
        history=f"{SEG_PATH}/history.csv",
        morph_log=f"{SEG_PATH}/morph_log.csv",
        alignment=f"{SEG_PATH}/alignment.csv",
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


rule seg_attack:
    input:
        data=lambda wc: processed_files(wc.dataset),
        model=f"{SEG_PATH}/model.pt",
    output:
        attack=f"{SEG_PATH}/attack.json",
    wildcard_constraints:
        dataset="duke|umn|covidct",
    params:
        processed=lambda wc: f"data/processed/{wc.dataset}",
        hp=lambda wc: GRID.params("seg", wc),
        seed=lambda wc: job_seed("seg", wc),
        device=config["device"],
    log:
        "logs/seg_attack/{dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}.log",
    benchmark:
        "benchmarks/seg_attack/{dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}.tsv"
    threads: TRAIN_THREADS
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=30,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_attack.py"


rule seg_main_table:
    input:
        lambda wc: SEG_METRICS[wc.dataset],
    output:
        reported("results/tables/seg_main_{dataset}", TAB, "seg_main", SEG_CAT, "Table 3"),
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
        reported("results/figures/seg_{fig}_{dataset}", FIG, "seg_clipping", SEG_CAT, "Figs. 3-5"),
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
        [f for d in SEG_MAIN_DATASETS for f in SEG_METRICS[d]],
    output:
        reported("results/measured/seg_fig8_training_time", FIG, "seg_fig8", SEG_CAT, "Fig. 8"),
    log:
        "logs/seg_training_time_figure.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_time_figure.py"


rule seg_examples_figure:
    input:
        [f for d in SEG_DATASETS for f in processed_files(d)],
    output:
        reported("results/figures/seg_fig1_examples", FIG, "seg_fig1", SEG_CAT, "Fig. 1"),
    params:
        processed={d: f"data/processed/{d}" for d in SEG_DATASETS},
    log:
        "logs/seg_examples_figure.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_examples_figure.py"


rule seg_lr_clip_figure:
    input:
        metrics=[f"{run}/metrics.json" for run in SEG_RUNS],
    output:
        figure=reported("results/figures/seg_fig2_lr_clip", FIG, "seg_fig2", SEG_CAT, "Fig. 2"),
        table=reported("results/tables/seg_fig2_lr_clip", TAB, "seg_fig2_table", SEG_CAT, "Fig. 2"),
    log:
        "logs/seg_lr_clip_figure.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_lr_clip_figure.py"


rule seg_visual_figure:
    input:
        data=[f for d in SEG_DATASETS for f in processed_files(d)],
        models=[f"{run}/model.pt" for run in SEG_RUNS],
    output:
        reported("results/figures/seg_fig6_visual", FIG, "seg_fig6", SEG_CAT, "Fig. 6"),
    params:
        processed={d: f"data/processed/{d}" for d in SEG_DATASETS},
        hp={j.path: j.params for j in SEG_JOBS},
    log:
        "logs/seg_visual_figure.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_visual_figure.py"


rule seg_morph_effect_figure:
    input:
        data=[f for d in SEG_DATASETS for f in processed_files(d)],
        models=[f"{run}/model.pt" for run in SEG_RUNS],
    output:
        reported("results/figures/seg_fig10_morph_effect", FIG, "seg_fig10", SEG_CAT, "Fig. 10"),
    params:
        processed={d: f"data/processed/{d}" for d in SEG_DATASETS},
        hp={j.path: j.params for j in SEG_JOBS},
    log:
        "logs/seg_morph_effect_figure.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_morph_effect_figure.py"


rule seg_alignment_figure:
    input:
        alignment=[f"{run}/alignment.csv" for run in SEG_PRIVATE_RUNS],
    output:
        reported("results/figures/seg_fig7_alignment", FIG, "seg_fig7", SEG_CAT, "Fig. 7"),
    log:
        "logs/seg_alignment_figure.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_alignment_figure.py"


rule seg_attack_report:
    input:
        attack=[f"{run}/attack.json" for run in SEG_RUNS],
    output:
        figure=reported("results/figures/seg_fig9_attack", FIG, "seg_fig9", SEG_CAT, "Fig. 9"),
        table=reported("results/tables/seg_attack", TAB, "seg_attack", SEG_CAT, "Fig. 9"),
    log:
        "logs/seg_attack_report.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_attack_figure.py"


rule seg_adaptive_figure:
    input:
        metrics=[f"{run}/metrics.json" for run in SEG_RUNS],
    output:
        reported("results/figures/seg_fig11_adaptive", FIG, "seg_fig11", SEG_CAT, "Fig. 11"),
    log:
        "logs/seg_adaptive_figure.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_adaptive_figure.py"


rule seg_layer_figure:
    input:
        history=[f"{run}/history.csv" for run in SEG_RUNS],
        morph_log=[f"{run}/morph_log.csv" for run in SEG_RUNS],
    output:
        reported("results/figures/seg_fig12_layers", FIG, "seg_fig12", SEG_CAT, "Fig. 12"),
    log:
        "logs/seg_layer_figure.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_layer_figure.py"


rule seg_rule_table:
    output:
        reported("results/tables/seg_table1_clip_rules", TAB, "seg_table1", SEG_CAT, "Table 1"),
    log:
        "logs/seg_rule_table.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_rule_table.py"


rule seg_quantile_table:
    input:
        metrics=[f"{run}/metrics.json" for run in SEG_RUNS],
    output:
        reported("results/tables/seg_table2_quantiles", TAB, "seg_table2", SEG_CAT, "Table 2"),
    params:
        quantiles=config["seg"]["defaults"]["quantiles"],
    log:
        "logs/seg_quantile_table.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_quantile_table.py"


rule seg_privacy_table:
    input:
        privacy=[f"{run}/privacy.json" for run in SEG_RUNS],
    output:
        reported("results/tables/seg_privacy", TAB, "seg_privacy", SEG_CAT, "sound vs paper"),
    log:
        "logs/seg_privacy_table.log",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/seg_privacy_table.py"


SEG_TARGETS = (
    [f"{run}/{name}" for run in SEG_RUNS for name in (*SEG_RUN_FILES, "attack.json")]
    + [f"results/tables/seg_main_{d}.csv" for d in SEG_MAIN_DATASETS]
    + [f"results/figures/{SEG_FIGURES[d]}.png" for d in SEG_MAIN_DATASETS]
    + (
        [
            "results/measured/seg_fig8_training_time.png",
            "results/figures/seg_fig1_examples.png",
            "results/figures/seg_fig6_visual.png",
            "results/figures/seg_fig9_attack.png",
            "results/figures/seg_fig10_morph_effect.png",
            "results/tables/seg_table1_clip_rules.csv",
        ]
        if SEG_MAIN_DATASETS
        else []
    )
    + (
        ["results/figures/seg_fig7_alignment.png", "results/tables/seg_privacy.csv"]
        if SEG_PRIVATE_RUNS
        else []
    )
    + (["results/figures/seg_fig2_lr_clip.png"] if SEG_HAS["sweep"] else [])
    + (["results/tables/seg_table2_quantiles.csv"] if SEG_HAS["quantiles"] else [])
    + (
        ["results/figures/seg_fig11_adaptive.png", "results/figures/seg_fig12_layers.png"]
        if SEG_HAS["adaptive"]
        else []
    )
)
STUDY_TARGETS.extend(SEG_TARGETS)


rule seg_results:
    input:
        SEG_TARGETS,


localrules:
    seg_main_table,
    seg_clipping_figure,
    seg_training_time_figure,
    seg_examples_figure,
    seg_lr_clip_figure,
    seg_visual_figure,
    seg_morph_effect_figure,
    seg_alignment_figure,
    seg_attack_report,
    seg_adaptive_figure,
    seg_layer_figure,
    seg_rule_table,
    seg_quantile_table,
    seg_privacy_table,
    seg_results,
