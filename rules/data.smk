"""Data stage: synthetic raw data (public raw formats) → processed arrays → data overview."""

from dpmed.data.manifest import manifest_path, refresh_manifest, write_manifest
from dpmed.logs import log_to

# Preprocessing reads each raw folder's manifest (dpmed.data.manifest): rewritten here, at every
# DAG build, when a file of the folder changed, so an overwritten raw file reruns preprocessing
# and everything downstream. Job processes that re-read the workflow leave it alone.
if workflow.is_main_process:
    for _dataset in DATASETS:
        refresh_manifest(raw_folder(_dataset), manifest_path(_dataset))


rule synthesize:
    output:
        directory("data/raw/{dataset}"),
    params:
        cfg=lambda wc: config["data"][wc.dataset],
    log:
        "logs/synthesize/{dataset}.log",
    resources:
        mem_mb=8000,
        runtime=120,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/synthesize.py"


rule raw_manifest:
    input:
        raw=lambda wc: raw_folder(wc.dataset),
    output:
        manifest_path("{dataset}"),
    log:
        "logs/raw_manifest/{dataset}.log",
    localrule: True
    run:
        with log_to(log[0]):
            write_manifest(input.raw, output[0])


rule preprocess:
    input:
        raw=lambda wc: raw_folder(wc.dataset),
        manifest=manifest_path("{dataset}"),
    output:
        multiext("data/processed/{dataset}/", *ARRAY_FILES),
    wildcard_constraints:
        dataset="|".join(datasets_writing()),
    params:
        cfg=lambda wc: config["data"][wc.dataset],
    log:
        "logs/preprocess/{dataset}.log",
    resources:
        mem_mb=16000,
        runtime=120,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/preprocess.py"


rule preprocess_fets:
    input:
        raw=lambda wc: raw_folder("fets"),
        manifest=manifest_path("fets"),
    output:
        splits="data/processed/fets/splits.csv",
        meta="data/processed/fets/meta.json",
        subjects=directory("data/processed/fets/subjects"),
    params:
        cfg=lambda wc: config["data"]["fets"],
    log:
        "logs/preprocess/fets.log",
    resources:
        mem_mb=8000,
        runtime=480,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/preprocess.py"


rule datasets_table:
    input:
        meta=expand("data/processed/{dataset}/meta.json", dataset=DATASETS),
    output:
        csv_path=reported("results/tables/datasets", TAB, "datasets", DATA_CAT, "datasets"),
    params:
        writer="dpmed.report.data:datasets_table",
        datasets=DATASETS,
    log:
        "logs/datasets_table.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/report_output.py"


rule data_overview:
    input:
        [f for dataset in DATASETS for f in processed_files(dataset)],
    output:
        reported("results/figures/data_overview", FIG, "data_overview", DATA_CAT, "datasets"),
    params:
        datasets=DATASETS,
    log:
        "logs/data_overview.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/data_overview.py"

