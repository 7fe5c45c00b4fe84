"""Empirical privacy audit: the config's `audit` block (dpmed.config.audit) picks
private grid cells; privacy_audit retrains one of them with canaries in one setting at one
noise scale (dpmed.audit) and writes

    results/audit/{study}/{cell}/{setting}/noise{noise}/audit.json

where {cell} is the audited run folder below results/{study}/. The audit reads the cell's
processed data, not its trained model (it trains the cell again, with the cell's
hyperparameters and job seed), and asks for the resources of the cell's training job.
privacy_audit_report gathers every audit into results/tables/privacy_audit.csv and
results/figures/privacy_audit.png.
"""

from dpmed.config.audit import AUDIT_FILE, AUDIT_PATH, AUDIT_PATTERNS
from dpmed.config.audit import audit_jobs, rule_job
from dpmed.config.grid import job_seed

AUDITS = audit_jobs(config, GRID)
AUDIT_FILES = [f"{job.path}/{AUDIT_FILE}" for job in AUDITS]


rule privacy_audit:
    input:
        lambda wc: processed_files(rule_job(config, wc).dataset),
    output:
        audit=f"{AUDIT_PATH}/{AUDIT_FILE}",
    wildcard_constraints:
        **AUDIT_PATTERNS,
    params:
        processed=lambda wc: f"data/processed/{rule_job(config, wc).dataset}",
        cell=lambda wc: rule_job(config, wc).wc,
        hp=lambda wc: GRID.params(wc.study, rule_job(config, wc).wc),
        seed=lambda wc: job_seed(wc.study, rule_job(config, wc).wc),
        canaries=lambda wc: rule_job(config, wc).canaries,
        confidence=config["audit"]["confidence"],
        noise_scale=lambda wc: rule_job(config, wc).noise_scale,
        device=config["device"],
    log:
        "logs/privacy_audit/{study}/{cell}/{setting}/noise{noise}.log",
    benchmark:
        "benchmarks/privacy_audit/{study}/{cell}/{setting}/noise{noise}.tsv"
    threads: TRAIN_THREADS
    resources:
        gpu=GPU,
        mem_mb=lambda wc, attempt: audit_request(config, GRID, wc, attempt, bool(GPU)).mem_mb,
        runtime=lambda wc, attempt: audit_request(config, GRID, wc, attempt, bool(GPU)).runtime,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/privacy_audit.py"


rule privacy_audit_report:
    input:
        audits=AUDIT_FILES,
    output:
        csv_path=reported(
            "results/tables/privacy_audit", TAB, "privacy_audit", PRIVACY_CAT, "empirical audit"
        ),
        png_path=reported(
            "results/figures/privacy_audit",
            FIG,
            "privacy_audit_figure",
            PRIVACY_CAT,
            "empirical audit",
        ),
    params:
        writer="dpmed.report.privacy_audit:write_privacy_audit",
    log:
        "logs/privacy_audit_report.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/report_output.py"


AUDIT_TARGETS = (
    ["results/tables/privacy_audit.csv", "results/figures/privacy_audit.png"] if AUDITS else []
)
