"""Config validation, target lists and wildcard constraints shared by every rule file."""

import sys
from pathlib import Path

from dpmed.benchmark_sampling import set_benchmark_interval
from dpmed.config.checks import check_config
from dpmed.config.grid import wildcard_patterns
from dpmed.data.registry import ARRAY_FILES, datasets_writing, processed_files
from dpmed.job_cost import audit_request, mem_cap_note, request as cost_request
from dpmed.report.outputs import EXTS_OF_KEYWORD, FIGURE_EXTS, TABLE_EXTS, menu_name, report_item
from dpmed.slurm_profile import check_gpu_requests, profile_placeholders
from dpmed.studies import STUDIES, claims_reader


GRID = check_config(config, dpmed_file("config/schema.yaml"))
# how often Snakemake samples a running job for its benchmark file (dpmed.benchmark_sampling)
set_benchmark_interval(config["logging"]["benchmark_interval"])
# Tables and figures the grid cannot feed are left out of the targets: say so and why (once,
# not again in every job process that re-reads the workflow).
if workflow.is_main_process:
    for _note in GRID.notes():
        print(f"dpmed note: {_note}", file=sys.stderr)
    # A site profile's `<...>` left unfilled (make slurm-profile) plans fine but cannot submit.
    for _note in profile_placeholders(workflow.resource_settings):
        print(f"dpmed warning: {_note}", file=sys.stderr)
DATASETS = GRID.datasets()
CONDA_ENV = "../envs/dpmed.yaml"
# What the job rules of a study run, as paths relative to src/dpmed/<study>/rules.smk, its
# rules: the environment, and the script that calls a job's `runner` param.
STUDY_CONDA_ENV = "../../../envs/dpmed.yaml"
JOB_SCRIPT = "../../../workflow/scripts/job.py"
# Training rules ask for one GPU unless the config pins the CPU (smoke runs then use both cores).
GPU = 0 if config["device"] == "cpu" else 1
TRAIN_THREADS = 1 if config["device"] == "cpu" else 4
# Report categories of the cross-study outputs.
DATA_CAT, PRIVACY_CAT = "data", "privacy"
FIG, TAB = FIGURE_EXTS, TABLE_EXTS


# The report's front page (`snakemake --report`). Declared here, not in the Snakefile: a path
# next to a Snakefile at the top of a git source (`git+file://…/Snakefile@<tag>`) does not
# resolve in Snakemake 9 (`dpmed_source` in the Snakefile).
report: "../workflow/report/workflow.rst"


wildcard_constraints:
    **wildcard_patterns(),


def job_mem_mb(rule):
    """`mem_mb` of a job of `rule`: sized from its settings by dpmed.job_cost, ×1.5 per retry,
    at most `resources.max_mem_mb` (said once per job and attempt when that cap binds)."""

    def mem_mb(wildcards, attempt):
        request = _request(rule, wildcards, attempt)
        note = mem_cap_note(rule, wildcards, attempt, request)
        if note and note not in _MEM_CAP_NOTES:
            _MEM_CAP_NOTES.add(note)
            print(f"dpmed note: {note}", file=sys.stderr)
        return request.mem_mb

    return mem_mb


_MEM_CAP_NOTES = set()


def job_runtime(rule):
    """`runtime` (minutes) of a job of `rule`: sized by dpmed.job_cost, ×2 per retry."""
    return lambda wildcards, attempt: _request(rule, wildcards, attempt).runtime


def _request(rule, wildcards, attempt):
    hp = GRID.params(rule.partition("_")[0], wildcards)
    return cost_request(rule, config, wildcards, hp, attempt, gpu=bool(GPU))


def raw_folder(dataset):
    """data/raw/<dataset> (generated) or the user's folder of the real download."""
    raw = config["data"][dataset]["raw"]
    return f"data/raw/{dataset}" if raw == "synthetic" else raw


def reported(stem, exts, caption, category, subcategory, captions="workflow/report"):
    """Output files `stem + ext` for each ext, in order; one goes into the report
    (`snakemake --report`: a table's .html, a figure's .png, dpmed.report.outputs) under
    category/subcategory (its menu name sorts by number) with <captions>/<caption>.rst (a folder
    of the repository: a study's are src/dpmed/<study>/captions)."""
    files = [f"{stem}{ext}" for ext in exts]
    shown = report_item(files)
    flagged = report(
        shown,
        caption=f"../{captions}/{caption}.rst",
        category=category,
        subcategory=menu_name(subcategory),
    )
    return [flagged if f == shown else f for f in files]


def study_targets():
    """Every study's final outputs (runs, tables, figures), as its spec lists them."""
    return [path for name, spec in STUDIES.items() for path in spec.targets(GRID.jobs(name))]


def study_runs():
    """The run folder of every job of every study."""
    return [job.path for name in STUDIES for job in GRID.jobs(name)]


def data_targets():
    """Processed data of every dataset in use, plus the cross-study data table and figures."""
    targets = [f for dataset in DATASETS for f in processed_files(dataset)]
    targets += ["results/tables/datasets.csv", "results/figures/data_overview.png"]
    return targets
