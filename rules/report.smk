"""Tables and figures: one rule per entry of every study's report registry (`StudySpec.reports`,
see dpmed.report.outputs), and the cross-study privacy summary of every DP run (with the
empirical audits at noise scale 1 of rules/audit.smk). The HTML report itself is built by
`snakemake --report results/report.html` (same --configfile/--profile as the run) from the
outputs flagged with `reported(...)`; captions are in workflow/report/ and a study's in
src/dpmed/<study>/captions/."""

from dpmed.report.claims import claims_evidence
from dpmed.report.outputs import shown_files, summary_inputs
from dpmed.sizing import sized_rules

for _study, _spec in STUDIES.items():
    for _name, _entry in _spec.reports.items():

        rule:
            name:
                _name
            input:
                **_entry.inputs(GRID.jobs(_study)),
            output:
                **{
                    keyword: reported(
                        stem,
                        EXTS_OF_KEYWORD[keyword],
                        caption,
                        _spec.category,
                        _entry.subcategory,
                        f"src/dpmed/{_study}/captions",
                    )
                    for keyword, (stem, caption) in _entry.files.items()
                },
            wildcard_constraints:
                **_entry.constraints,
            params:
                writer=_entry.writer,
                **(_entry.params(GRID.jobs(_study), config) if _study in config else {}),
            log:
                _entry.log(_name),
            localrule: True
            conda:
                CONDA_ENV
            script:
                "../workflow/scripts/report_output.py"


rule privacy_summary:
    input:
        privacy=[f"{run}/privacy.json" for run in study_runs()],
        audits=[f for job, f in zip(AUDITS, AUDIT_FILES) if job.noise_scale == 1],
    output:
        csv_path=reported(
            "results/tables/privacy_summary", TAB, "privacy_summary", PRIVACY_CAT, "all studies"
        ),
    params:
        writer="dpmed.report.privacy_summary:write_privacy_summary",
    log:
        "logs/privacy_summary.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/report_output.py"


# Which of each paper's claims this run supports (dpmed.report.claims): one table across the
# studies with claims, and their wall-clock claims apart (results/measured: not byte-identical).
CLAIM_SOURCES = {
    name: spec.claims for name, spec in STUDIES.items() if spec.claims and GRID.jobs(name)
}
CLAIM_READERS = [claims_reader(name) for name in CLAIM_SOURCES]
CLAIMS_CAT = "claims"
# The files the report shows (a table's .html, a figure's .png) of the study registries' entries
# and of the study targets in results/: the evidence a claims row links.
SHOWN = list(
    dict.fromkeys(
        [path for name, spec in STUDIES.items() for path in shown_files(spec.reports, GRID.jobs(name))]
        + [
            report_item([path.removesuffix(".csv") + ext for ext in TAB]) if path.endswith(".csv") else path
            for path in study_targets()
            if path.startswith(("results/tables/", "results/figures/", "results/measured/"))
        ]
    )
)


rule claims:
    input:
        **{
            f"{study}__{key}": files
            for study, inputs in CLAIM_SOURCES.items()
            for key, files in inputs(GRID.jobs(study)).items()
        },
    output:
        # one verdict per claim first, then the cells behind each
        claims=reported("results/tables/claims", TAB, "claims", CLAIMS_CAT, "paper claims"),
        cells=reported(
            "results/tables/claims_cells", TAB, "claims_cells", CLAIMS_CAT, "paper claims"
        ),
        pairs=[f"results/tables/claims_pairs{ext}" for ext in TAB],
        # the claims counted per paper and verdict: the report front page shows this table
        counts=reported(
            "results/tables/claims_counts", TAB, "claims_counts", CLAIMS_CAT, "paper claims"
        ),
        measured=reported(
            "results/measured/claims_measured", TAB, "claims_measured", CLAIMS_CAT, "measured"
        ),
        measured_cells=reported(
            "results/measured/claims_measured_cells", TAB, "claims_cells", CLAIMS_CAT, "measured"
        ),
        measured_pairs="results/measured/claims_measured_pairs.csv",
    params:
        readers={study: claims_reader(study) for study in CLAIM_SOURCES},
        config_name=" + ".join(Path(path).name for path in CONFIG_FILES),
        shown=SHOWN,
        evidence=claims_evidence(CLAIM_READERS, SHOWN),
        evidence_measured=claims_evidence(CLAIM_READERS, SHOWN, measured=True),
    log:
        "logs/claims.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/claims.py"


# How many seeds each claim needs for 80 % power at its corrected level, and what they cost on
# the paper config's grid (dpmed.report.power), from this run's paired differences.
rule power_plan:
    input:
        pairs=[rules.claims.output.pairs[0]],
    output:
        csv_path=reported("results/tables/power_plan", TAB, "power_plan", CLAIMS_CAT, "power plan"),
    params:
        writer="dpmed.report.power:write_power_plan",
        target=dpmed_file("config/config.yaml"),
    log:
        "logs/power_plan.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/report_output.py"


# The demo's targets met or not and its measured tables (dpmed.report.demo_summary): the numbers
# docs/demo.md links instead of stating them.
DEMO_SUMMARY_INPUTS = summary_inputs({name: GRID.jobs(name) for name in STUDIES})


rule demo_summary:
    input:
        **DEMO_SUMMARY_INPUTS,
    output:
        md_path=["results/demo_summary.md"],
        csv_path=reported("results/tables/demo_summary", TAB, "demo_summary", CLAIMS_CAT, "demo targets"),
    params:
        writer="dpmed.report.demo_summary:write_demo_summary",
    log:
        "logs/demo_summary.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/report_output.py"


# Each training job's wall time and peak memory as this run measured them (Snakemake's benchmark
# files) beside what the job-cost model predicted and the job asked for (dpmed.job_cost):
# results/measured, not byte-identical. A study whose training rule keeps no benchmark has none.
_BENCHMARKED = {r.name for r in workflow.rules if r.benchmark is not None}
JOB_BENCHMARKS = [
    STUDIES[study].log(rule, "tsv").format(**dict(job.wildcards))
    for rule, study in sized_rules().items()
    if rule == f"{study}_train" and rule in _BENCHMARKED
    for job in GRID.jobs(study)
]


rule job_cost_measured:
    input:
        benchmarks=JOB_BENCHMARKS,
    output:
        reported("results/measured/job_cost", TAB, "job_cost", "resources", "job cost"),
    log:
        "logs/job_cost_measured.log",
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/job_cost_measured.py"


REPORT_TARGETS = ["results/tables/privacy_summary.csv"] if study_runs() else []
REPORT_TARGETS += ["results/measured/job_cost.csv"] if JOB_BENCHMARKS else []
REPORT_TARGETS += ["results/tables/claims.csv"] if CLAIM_SOURCES else []
REPORT_TARGETS += ["results/tables/power_plan.csv"] if CLAIM_SOURCES else []
REPORT_TARGETS += ["results/demo_summary.md"] if study_runs() else []
REPORT_TARGETS += AUDIT_TARGETS
