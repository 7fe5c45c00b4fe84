"""The preflight (docs/preflight.md). With `--config preflight=true` (or `sample`) the targets
are results/preflight/ only: every distinct cell of the grid probed at its configured sizes on
the configured device, σ calibrated for each ε, each peak checked against its rule's request,
and the grid's projected cost; `snakemake --report` then shows the tables and the figure. On a
cluster profile the job asks for a GPU like the training rules, so a GPU node measures the
GPU's seconds per step."""

from dpmed.preflight.run import preflight_mode, preflight_request

PREFLIGHT = "results/preflight"
PREFLIGHT_CAT = "preflight"
PREFLIGHT_MODE = preflight_mode(config["preflight"])  # off, all or sample
PREFLIGHT_SAMPLE = PREFLIGHT_MODE == "sample"
# (mem_mb, runtime) of the preflight job, computed once and only when the preflight runs
PREFLIGHT_REQUEST = (
    preflight_request(config, GRID, PREFLIGHT_SAMPLE, bool(GPU)) if PREFLIGHT_MODE != "off" else (0, 0)
)


rule preflight:
    output:
        cells=reported(f"{PREFLIGHT}/preflight", TAB, "preflight", PREFLIGHT_CAT, "cells"),
        cost=reported(f"{PREFLIGHT}/cost", TAB, "preflight_cost", PREFLIGHT_CAT, "cost"),
        figure=reported(f"{PREFLIGHT}/cost", FIG, "preflight_cost_figure", PREFLIGHT_CAT, "cost"),
    params:
        sample=PREFLIGHT_SAMPLE,
    log:
        "logs/preflight.log",
    resources:
        gpu=GPU,
        mem_mb=PREFLIGHT_REQUEST[0],
        runtime=PREFLIGHT_REQUEST[1],
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/preflight.py"


# The last rule file the Snakefile includes: with every rule parsed, the GPU requests the site
# profile makes of them are checked once, before any job is planned (dpmed.slurm_profile).
if workflow.is_main_process:
    check_gpu_requests(workflow.rules)
