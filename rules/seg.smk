"""seg study (paper 002): DP-SGD clipping rules × DP-Morph segmentation.

seg_train runs one cell {dataset}/{model}/{clip}/{morph}/eps{eps}/seed{seed}; its checkpoint
(checkpoint.pt in the job folder) is not an output: a killed job resumes from it and it is
deleted once the outputs are written. seg_attack scores one trained model with the global-loss
membership attack. Tables and figures read only the cells the grid ran: the paper's main
tables/figures (Table 3, Figs. 3–5, 8) its main cells, the ablation outputs (Fig. 2, Table 2)
the sweep/quantile cells, the analyses (Figs. 6, 7, 9–12, privacy tables) every cell. Each
table/figure rule names its writer (`params.writer`), which seg_report_output.py calls with the
rule's named inputs, outputs and params; which of them `rule all` asks for is
`dpmed.seg.spec.REPORTS`.
"""

import dpmed.seg.spec as seg_spec
from dpmed.config.grid import job_seed

SEG = seg_spec.SPEC
SEG_JOBS = GRID.jobs("seg")
SEG_RUNS = [job.path for job in SEG_JOBS]
SEG_PRIVATE_RUNS = seg_spec.private_runs(SEG_JOBS)
SEG_PAPER_METRICS = [
    f for d in seg_spec.main_datasets(SEG_JOBS) for f in seg_spec.paper_metrics(SEG_JOBS, d)
]
SEG_PROCESSED = {d: f"data/processed/{d}" for d in seg_spec.datasets_of(SEG_JOBS)}
SEG_DATA = [f for d in SEG_PROCESSED for f in processed_files(d)]
SEG_REPORT = "../workflow/scripts/seg_report_output.py"


rule seg_train:
    input:
        lambda wc: processed_files(wc.dataset),
    output:
        **{name.partition(".")[0]: f"{SEG.path}/{name}" for name in SEG.run_files},
    wildcard_constraints:
        **SEG.patterns,
    params:
        processed=lambda wc: f"data/processed/{wc.dataset}",
        hp=lambda wc: GRID.params("seg", wc),
        seed=lambda wc: job_seed("seg", wc),
        device=config["device"],
    log:
        SEG.log("seg_train"),
    benchmark:
        SEG.log("seg_train", "tsv")
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
        model=f"{SEG.path}/model.pt",
    output:
        attack=f"{SEG.path}/{seg_spec.ATTACK_FILE}",
    wildcard_constraints:
        **SEG.patterns,
    params:
        processed=lambda wc: f"data/processed/{wc.dataset}",
        hp=lambda wc: GRID.params("seg", wc),
        seed=lambda wc: job_seed("seg", wc),
        device=config["device"],
    log:
        SEG.log("seg_attack"),
    benchmark:
        SEG.log("seg_attack", "tsv")
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
        metrics_paths=lambda wc: seg_spec.paper_metrics(SEG_JOBS, wc.dataset),
    output:
        csv_path=reported("results/tables/seg_main_{dataset}", TAB, "seg_main", SEG_CAT, "Table 3"),
    wildcard_constraints:
        dataset=SEG.patterns["dataset"],
    params:
        writer="dpmed.seg.report.main:write_main_table",
        dataset=lambda wc: wc.dataset,
    log:
        "logs/seg_main_table/{dataset}.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_clipping_figure:
    input:
        metrics_paths=lambda wc: seg_spec.paper_metrics(SEG_JOBS, wc.dataset),
    output:
        png_path=reported(
            "results/figures/seg_{fig}_{dataset}", FIG, "seg_clipping", SEG_CAT, "Figs. 3-5"
        ),
    wildcard_constraints:
        fig="|".join(seg_spec.DATASET_FIGURE.values()),
        dataset=SEG.patterns["dataset"],
    params:
        writer="dpmed.seg.report.main:clipping_figure",
        dataset=lambda wc: wc.dataset,
    log:
        "logs/seg_clipping_figure/{fig}_{dataset}.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_training_time_figure:
    input:
        metrics_paths=SEG_PAPER_METRICS,
    output:
        png_path=reported(
            "results/measured/seg_fig8_training_time", FIG, "seg_fig8", SEG_CAT, "Fig. 8"
        ),
    params:
        writer="dpmed.seg.report.main:training_time_figure",
    log:
        "logs/seg_training_time_figure.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_examples_figure:
    input:
        SEG_DATA,
    output:
        png_path=reported("results/figures/seg_fig1_examples", FIG, "seg_fig1", SEG_CAT, "Fig. 1"),
    params:
        writer="dpmed.seg.report.visual:examples_figure",
        processed_dirs=SEG_PROCESSED,
    log:
        "logs/seg_examples_figure.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_lr_clip_figure:
    input:
        metrics_paths=[f"{run}/metrics.json" for run in SEG_RUNS],
    output:
        png_path=reported("results/figures/seg_fig2_lr_clip", FIG, "seg_fig2", SEG_CAT, "Fig. 2"),
        csv_path=reported("results/tables/seg_fig2_lr_clip", TAB, "seg_fig2_table", SEG_CAT, "Fig. 2"),
    params:
        writer="dpmed.seg.report.ablation:lr_clip_report",
    log:
        "logs/seg_lr_clip_figure.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_visual_figure:
    input:
        SEG_DATA,
        model_paths=[f"{run}/model.pt" for run in SEG_RUNS],
    output:
        png_path=reported("results/figures/seg_fig6_visual", FIG, "seg_fig6", SEG_CAT, "Fig. 6"),
    params:
        writer="dpmed.seg.report.visual:visual_figure",
        processed=SEG_PROCESSED,
    log:
        "logs/seg_visual_figure.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_morph_effect_figure:
    input:
        SEG_DATA,
        model_paths=[f"{run}/model.pt" for run in SEG_RUNS],
    output:
        png_path=reported(
            "results/figures/seg_fig10_morph_effect", FIG, "seg_fig10", SEG_CAT, "Fig. 10"
        ),
    params:
        writer="dpmed.seg.report.visual:morph_effect_figure",
        processed=SEG_PROCESSED,
    log:
        "logs/seg_morph_effect_figure.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_alignment_figure:
    input:
        alignment_paths=[f"{run}/alignment.csv" for run in SEG_PRIVATE_RUNS],
    output:
        png_path=reported("results/figures/seg_fig7_alignment", FIG, "seg_fig7", SEG_CAT, "Fig. 7"),
    params:
        writer="dpmed.seg.report.alignment:alignment_figure",
    log:
        "logs/seg_alignment_figure.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_attack_report:
    input:
        attack_paths=[f"{run}/{seg_spec.ATTACK_FILE}" for run in SEG_RUNS],
    output:
        png_path=reported("results/figures/seg_fig9_attack", FIG, "seg_fig9", SEG_CAT, "Fig. 9"),
        csv_path=reported("results/tables/seg_attack", TAB, "seg_attack", SEG_CAT, "Fig. 9"),
    params:
        writer="dpmed.seg.report.attack:attack_report",
    log:
        "logs/seg_attack_report.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_adaptive_figure:
    input:
        metrics_paths=[f"{run}/metrics.json" for run in SEG_RUNS],
    output:
        png_path=reported(
            "results/figures/seg_fig11_adaptive", FIG, "seg_fig11", SEG_CAT, "Fig. 11"
        ),
    params:
        writer="dpmed.seg.report.adaptive:adaptive_figure",
    log:
        "logs/seg_adaptive_figure.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_layer_figure:
    input:
        [f"{run}/{name}" for run in SEG_RUNS for name in ("history.csv", "morph_log.csv")],
    output:
        png_path=reported("results/figures/seg_fig12_layers", FIG, "seg_fig12", SEG_CAT, "Fig. 12"),
    params:
        writer="dpmed.seg.report.adaptive:layer_figure",
        run_dirs=SEG_RUNS,
    log:
        "logs/seg_layer_figure.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_rule_table:
    output:
        csv_path=reported(
            "results/tables/seg_table1_clip_rules", TAB, "seg_table1", SEG_CAT, "Table 1"
        ),
    params:
        writer="dpmed.seg.report.privacy:write_clip_rule_table",
    log:
        "logs/seg_rule_table.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_quantile_table:
    input:
        metrics_paths=[f"{run}/metrics.json" for run in SEG_RUNS],
    output:
        csv_path=reported(
            "results/tables/seg_table2_quantiles", TAB, "seg_table2", SEG_CAT, "Table 2"
        ),
    params:
        writer="dpmed.seg.report.ablation:write_quantile_table",
        quantiles=config["seg"]["defaults"]["quantiles"],
    log:
        "logs/seg_quantile_table.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_privacy_table:
    input:
        privacy_paths=[f"{run}/privacy.json" for run in SEG_RUNS],
    output:
        csv_path=reported("results/tables/seg_privacy", TAB, "seg_privacy", SEG_CAT, "sound vs paper"),
    params:
        writer="dpmed.seg.report.privacy:write_seg_privacy_table",
    log:
        "logs/seg_privacy_table.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        SEG_REPORT


rule seg_results:
    input:
        SEG.targets(SEG_JOBS),
    localrule: True
