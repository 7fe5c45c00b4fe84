"""Cross-study outputs: the privacy summary of every DP run. The HTML report itself is built by
`snakemake --report results/report.html` (same --configfile/--profile as the run) from the
outputs flagged with `reported(...)`; captions are in workflow/report/."""


rule privacy_summary:
    input:
        privacy=[f"{run}/privacy.json" for run in study_runs()],
    output:
        reported("results/tables/privacy_summary", TAB, "privacy_summary", PRIVACY_CAT, "all studies"),
    log:
        "logs/privacy_summary.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/privacy_summary.py"


REPORT_TARGETS = ["results/tables/privacy_summary.csv"] if study_runs() else []
