"""toy study: one toy_train job per cell of `toy.grid` (dpmed.toy.spec)."""

from dpmed.toy.spec import SPEC as TOY


rule toy_train:
    input:
        lambda wc: processed_files(wc.dataset),
    output:
        **{name.partition(".")[0]: f"{TOY.path}/{name}" for name in TOY.run_files},
    wildcard_constraints:
        **TOY.patterns,
    params:
        runner="dpmed.toy.run:run",
        processed=lambda wc: f"data/processed/{wc.dataset}",
        hp=lambda wc: GRID.params("toy", wc),
        seed=lambda wc: TOY.job_seed(wc),
        device=config["device"],
    log:
        TOY.log("toy_train"),
    resources:
        mem_mb=job_mem_mb("toy_train"),
        runtime=job_runtime("toy_train"),
    script:
        JOB_SCRIPT


rule toy_results:
    input:
        TOY.targets(GRID.jobs("toy")),
    localrule: True
