"""What a training or attack job asks the scheduler for: memory (MB) and time (minutes), from
the job's settings, so a smoke job asks for what a smoke job needs and a paper job for what a
paper job needs.

Each registered study sizes its own rules (`dpmed.<study>.sizing`, a `dpmed.sizing.StudySizing`
in `<study>/sizing.py`); this module iterates over the study registry and never names a
study. Peak memory = Σ coefficient × memory feature. Time follows the one runtime model the
preflight shares (`dpmed.sizing`): Σ count × seconds of one unit over the job's units of work
(training steps, evaluation batches, aggregated updates, ROAD passes, ...), where the fitted
seconds of a unit are its term's coefficient × the unit's work `size` plus what one unit costs
whatever its size (`count_<unit>`: Python, data loading, optimiser and DP bookkeeping, the
whole cost of a small job's step); the preflight uses its measured seconds instead. The time
features are therefore Σ count × size per term, each unit's count and a constant (start-up).
`bench/job_cost.py` fits the coefficients (this module's `job_cost.json`) on measured jobs,
all on CPU: the Snakemake benchmarks of finished runs (the demo's, a workstation's or a
cluster's), small cells it runs itself at several sizes, and a preflight's peaks and projected
times at the paper's sizes. Memory is the least upper envelope of the measured peaks (every one
at or below its prediction, so each measured job's request is at least `MEM_MARGIN` × its
peak), time the non-negative least-squares fit of the relative residuals (jobs of seconds and of
hours weigh alike). Memory has fitted terms (the interpreter and libraries, `const`;
activations per model, `act_*`, and for seg what DP-SGD's per-sample gradients and adaptive
DP-Morph hold beside them) and terms whose size is known exactly: `host` (the arrays a job
holds, host-side model states) and `device` (weights, gradients, optimiser moments and DP-SGD's
per-sample gradients).

SLURM's `--mem` is host memory. A CPU job asks for all of it; a job that asks for a GPU keeps
activations and gradients on the device, so it asks for the host part plus `CUDA_HOST_MB` for
the CUDA libraries, and `python -m dpmed.job_cost` prints the compute part as an upper bound of
its GPU memory (measured on CPU). The request adds a margin: `MEM_MARGIN` × the predicted peak
(at least `MEM_FLOOR_MB`) and `TIME_MARGIN` × the predicted time plus `TIME_FLOOR_MIN`. A GPU
job divides its CPU-measured time by `resources.gpu_speedup` (an assumption, not a
measurement: no GPU was at hand when the model was fitted), and no request exceeds
`resources.max_runtime` or `resources.max_mem_mb` (the largest node of the partition;
`mem_cap_note` says when that cap binds). A retry asks for `MEM_GROWTH`^(attempt−1) more memory
and `TIME_GROWTH`^(attempt−1) more time; a job cut off by its time limit resumes from its
checkpoint. `resources.<rule>.mem_scale` / `runtime_scale` scale one rule for a site.

To see what a grid asks for (the config files as `--configfile` gives them; default
config/config.yaml; `--markdown` prints Markdown tables, the ones docs/cluster.md includes):

    python -m dpmed.job_cost [--markdown] [FILE ...]
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpmed.sizing import RuleSizing, sized_rules, study_sizing

if TYPE_CHECKING:
    from dpmed.config.grid import Grid

COEFFICIENTS_FILE = Path(__file__).with_name("job_cost.json")
MEM_MARGIN = 1.5  # × predicted peak RSS
TIME_MARGIN = 2.0  # × predicted wall time
TIME_FLOOR_MIN = 10  # minutes added to every request (start-up, scheduling, file system)
MEM_FLOOR_MB = 2000
CUDA_HOST_MB = 3000  # host memory of the CUDA runtime, cuDNN and cuBLAS in a torch process
MEM_GROWTH = 1.5  # per retry
TIME_GROWTH = 2.0  # per retry
# A table's header of a number this model gives: it says "predicted" and names the model.
MODEL = "job-cost model"
REQUEST_LABELS = {
    "mem_mb": f"mem_mb requested ({MODEL}: predicted peak × margin)",
    "runtime_min": f"runtime_min requested ({MODEL}: predicted time × margin)",
    "gpu_mb": f"gpu_mb bound ({MODEL}: predicted compute memory × margin)",
}


@dataclass(frozen=True)
class Request:
    """A job's request: host memory in MB and runtime in minutes (Snakemake `mem_mb`,
    `runtime`); for a GPU job also `gpu_mb`, the compute part of its CPU-measured peak with
    the same margin, an upper bound of the GPU memory it needs (0 for a CPU job). When
    `resources.max_mem_mb` caps `mem_mb`, `uncapped_mem_mb` is what the job would have asked
    for (else 0)."""

    mem_mb: int
    runtime: int
    gpu_mb: int = 0
    uncapped_mem_mb: int = 0


def rule_sizing(rule: str) -> RuleSizing:
    """The sizing of `rule` (a rule of some registered study)."""
    return study_sizing(sized_rules()[rule]).rules[rule]


def features(
    rule: str, config: Mapping[str, Any], wildcards: Mapping[str, str], hp: Mapping[str, Any]
) -> tuple[dict[str, float], dict[str, float]]:
    """(memory features, time features) of one job of `rule`; a time feature is the work its
    coefficient prices, Σ count × size over the job's units of that term, a unit's count
    (`count_<unit>`: what one unit costs whatever its size, the whole cost of a small job's
    step), or `const`."""
    data, sizing = config["data"], rule_sizing(rule)
    time = {"const": 1.0}
    for name, unit in sizing.work(data, wildcards, hp).items():
        time[unit.term] = time.get(unit.term, 0.0) + unit.count * unit.size
        time[f"count_{name}"] = unit.count
    return sizing.memory(data, wildcards, hp), time


@cache
def coefficients() -> dict[str, Any]:
    """The fitted coefficients per rule (`bench/job_cost.py` writes them; the points they were
    fitted on are bench/job_cost_points.jsonl)."""
    return json.loads(COEFFICIENTS_FILE.read_text())


@dataclass(frozen=True)
class Cost:
    """A job's predicted peak on the measuring machine: host MB (interpreter, libraries, data,
    host-side states), compute MB (activations, gradients, per-sample gradients: host memory on
    a CPU, device memory on a GPU) and wall seconds on its CPU."""

    host_mb: float
    compute_mb: float
    seconds: float


def predict(
    rule: str,
    mem: Mapping[str, float],
    time: Mapping[str, float],
    model: Mapping[str, Any] | None = None,
) -> Cost:
    """The prediction of the fitted `model` (default: `coefficients()`, the saved one). A
    feature the fit has no coefficient for (a model that was not measured) takes the largest
    coefficient of its kind, so it is never priced at 0."""
    fitted = (model or coefficients())["rules"][rule]

    def coefficient(kind: str, name: str) -> float:
        coef = fitted[kind]
        if name in coef:
            return coef[name]
        prefix = name.split("_")[0] + "_"
        return max(v for k, v in coef.items() if k.startswith(prefix))

    act = sum(coefficient("mem", n) * v for n, v in mem.items() if n.startswith("act_"))
    return Cost(
        host_mb=coefficient("mem", "const") + mem["host"],
        compute_mb=act + mem["device"],
        seconds=sum(coefficient("time", n) * v for n, v in time.items()),
    )


def request(
    rule: str,
    config: Mapping[str, Any],
    wildcards: Mapping[str, str],
    hp: Mapping[str, Any],
    attempt: int = 1,
    gpu: bool = False,
) -> Request:
    """The memory and runtime `rule` asks for on `attempt` (1 for the first try). A rule
    `bench/job_cost.py` has not fitted yet (a new study's) asks for the most any job may:
    `resources.max_mem_mb` and `resources.max_runtime`."""
    settings = config.get("resources", {})
    if rule not in coefficients()["rules"]:
        return Request(mem_mb=int(settings["max_mem_mb"]),
                       runtime=math.ceil(settings["max_runtime"]))  # fmt: skip
    cost = predict(rule, *features(rule, config, wildcards, hp))
    scale = settings.get(rule, {})
    seconds, mem, gpu_mb = cost.seconds, cost.host_mb + cost.compute_mb, 0
    if gpu:
        gpu_mb = math.ceil(MEM_MARGIN * cost.compute_mb)
        seconds /= float(settings.get("gpu_speedup", 1.0))
        mem = cost.host_mb + CUDA_HOST_MB
    mem_mb = max(MEM_FLOOR_MB, MEM_MARGIN * mem) * float(scale.get("mem_scale", 1.0))
    minutes = (TIME_MARGIN * seconds / 60 + TIME_FLOOR_MIN) * float(scale.get("runtime_scale", 1.0))
    minutes *= TIME_GROWTH ** (attempt - 1)
    wanted = math.ceil(mem_mb * MEM_GROWTH ** (attempt - 1))
    cap = settings.get("max_mem_mb", wanted)
    return Request(
        mem_mb=min(wanted, cap),
        runtime=math.ceil(min(minutes, float(settings.get("max_runtime", math.inf)))),
        gpu_mb=gpu_mb,
        uncapped_mem_mb=wanted if wanted > cap else 0,
    )


def predicted(
    rule: str,
    config: Mapping[str, Any],
    wildcards: Mapping[str, str],
    hp: Mapping[str, Any],
    gpu: bool = False,
) -> tuple[float, float]:
    """(peak host MB, wall seconds) the fitted model predicts for one job of `rule`, before
    the request's margins: on a GPU the host part plus `CUDA_HOST_MB`, and the time ÷
    `resources.gpu_speedup` (an assumption); NaN for a rule not fitted yet."""
    if rule not in coefficients()["rules"]:
        return math.nan, math.nan
    cost = predict(rule, *features(rule, config, wildcards, hp))
    if gpu:
        speedup = float(config.get("resources", {}).get("gpu_speedup", 1.0))
        return cost.host_mb + CUDA_HOST_MB, cost.seconds / speedup
    return cost.host_mb + cost.compute_mb, cost.seconds


def beside_measured(config: Mapping[str, Any], grid: Grid, benchmarks: Sequence[str]) -> Any:
    """One row per job whose Snakemake benchmark file is among `benchmarks`
    (`benchmarks/<rule>/<run>.tsv`, `dpmed.config.study.StudySpec.log`): the wall seconds and
    peak RSS this run measured, each beside what this model predicts for the job, then the
    job's request; jobs ask for a GPU unless the config pins the CPU, as in the rules."""
    import re

    import pandas as pd

    from dpmed.config.grid import wildcards_from_path

    gpu = config["device"] != "cpu"
    rows = []
    for path in benchmarks:
        rule, run = re.search(r"benchmarks/(\w+)/(.+)\.tsv$", Path(path).as_posix()).groups()
        study = sized_rules()[rule]
        wc = wildcards_from_path(study, f"results/{study}/{run}")
        header, values = Path(path).read_text().splitlines()[:2]
        measured = dict(zip(header.split("\t"), values.split("\t"), strict=True))
        hp = grid.params(study, wc)
        peak, seconds = predicted(rule, config, wc, hp, gpu)
        req = request(rule, config, wc, hp, gpu=gpu)
        rows.append({
            "rule": rule, "run": f"results/{study}/{run}", "device": config["device"],
            "wall_s measured (Snakemake benchmark)": float(measured["s"]),
            f"wall_s predicted ({MODEL})": seconds,
            "peak_rss_mb measured (Snakemake benchmark max_rss)": float(measured["max_rss"]),
            f"peak_rss_mb predicted ({MODEL})": peak,
            REQUEST_LABELS["mem_mb"]: req.mem_mb, REQUEST_LABELS["runtime_min"]: req.runtime,
        })  # fmt: skip
    return pd.DataFrame(rows)


def audit_request(
    config: Mapping[str, Any], grid: Grid, wildcards: Mapping[str, str], attempt: int, gpu: bool
) -> Request:
    """What a `privacy_audit` job asks the scheduler for on `attempt`: the request of the
    audited cell's training job (`dpmed.job_cost`), since the audit trains the cell once."""
    from dpmed.config.audit import rule_job

    job = rule_job(config, wildcards)
    hp = grid.params(job.study, job.wc)
    return request(f"{job.study}_train", config, job.wc, hp, attempt, gpu=gpu)


def mem_cap_note(rule: str, wildcards: Mapping[str, str], attempt: int, req: Request) -> str:
    """What to say when `resources.max_mem_mb` caps a job's memory ('' when it does not)."""
    if not req.uncapped_mem_mb:
        return ""
    job = ", ".join(f"{k}={v}" for k, v in wildcards.items())
    return (
        f"{rule} ({job}), attempt {attempt}: asks for {req.mem_mb} MB, the "
        f"resources.max_mem_mb cap, instead of {req.uncapped_mem_mb} MB"
    )


def grid_requests(config: Mapping[str, Any], grid: Grid) -> Counter[tuple[str, Request]]:
    """How many jobs of `grid` (expanded from the validated `config`) ask for each (rule,
    first-try request), the `privacy_audit` jobs of its `audit` block included (each asks for
    its cell's training request); jobs ask for a GPU unless the config pins the CPU, as in the
    rules."""
    from dpmed.config.audit import audit_jobs

    gpu = config["device"] != "cpu"
    counts: Counter[tuple[str, Request]] = Counter()
    for rule, study in sized_rules().items():
        for job in grid.jobs(study):
            wc = dict(job.wildcards)
            counts[rule, request(rule, config, wc, grid.params(study, wc), gpu=gpu)] += 1
    for audit in audit_jobs(config, grid):
        counts["privacy_audit", audit_request(config, grid, audit.rule_wildcards, 1, gpu)] += 1
    return counts


def requests_table(counts: Counter[tuple[str, Request]]) -> list[tuple[str, Request, int]]:
    """(rule, request, jobs) of every distinct request in `counts`, by rule, largest first."""
    ordered = sorted(counts.items(), key=lambda kv: (kv[0][0], -kv[0][1].mem_mb, -kv[0][1].runtime))
    return [(rule, req, n) for (rule, req), n in ordered]


def markdown(config: Mapping[str, Any], counts: Counter[tuple[str, Request]]) -> str:
    """The sizing rules and the requests of `counts` (of the validated `config`'s grid) as
    Markdown: the margins, per rule its jobs and largest request, then every distinct request;
    docs/cluster.md includes it, so its numbers are the code's."""
    settings = config["resources"]
    rows = requests_table(counts)
    lines = [
        f"A job asks for {MEM_MARGIN:g} × its predicted peak memory (at least {MEM_FLOOR_MB} MB)"
        f" and {TIME_MARGIN:g} × its predicted time plus {TIME_FLOOR_MIN} minutes; a GPU job"
        f" divides its time by `resources.gpu_speedup` ({settings['gpu_speedup']:g} here). No"
        f" request exceeds `resources.max_mem_mb` ({settings['max_mem_mb']} MB here) or"
        f" `resources.max_runtime` ({settings['max_runtime']:g} minutes here). A retry asks for"
        f" {MEM_GROWTH:g} × the memory and {TIME_GROWTH:g} × the time of the try before.",
        "",
        "| rule | jobs | GPU jobs | largest mem_mb | longest runtime (min) | largest GPU MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for rule in sorted({rule for rule, _, _ in rows}):
        mine = [(req, n) for r, req, n in rows if r == rule]
        lines.append(
            f"| `{rule}` | {sum(n for _, n in mine)} | {sum(n for req, n in mine if req.gpu_mb)} | "
            f"{max(req.mem_mb for req, _ in mine)} | {max(req.runtime for req, _ in mine)} | "
            f"{max(req.gpu_mb for req, _ in mine) or '-'} |"
        )
    total = sum(n for _, _, n in rows)
    lines.append(f"| all | {total} | {sum(n for _, req, n in rows if req.gpu_mb)} | | | |")
    lines += [
        "",
        "| rule | mem_mb | runtime (min) | GPU MB bound | jobs |",
        "|---|---:|---:|---:|---:|",
    ]
    for rule, req, n in rows:
        capped = f" (capped; wants {req.uncapped_mem_mb})" if req.uncapped_mem_mb else ""
        lines.append(
            f"| `{rule}` | {req.mem_mb}{capped} | {req.runtime} | {req.gpu_mb or '-'} | {n} |"
        )
    return "\n".join(lines) + "\n\n" + totals(config, counts)


def grid_hours(config: Mapping[str, Any], counts: Counter[tuple[str, Request]]) -> dict[str, float]:
    """{"CPU": hours, "GPU": hours} the jobs of `counts` request in all (runtime × jobs; a GPU
    job holds one GPU, a CPU job one core); jobs ask for a GPU unless the config pins the CPU."""
    hours = sum(req.runtime * n for (_, req), n in counts.items()) / 60
    gpu = config["device"] != "cpu"
    return {"CPU": 0.0 if gpu else hours, "GPU": hours if gpu else 0.0}


def job_groups() -> tuple[dict[str, str], dict[str, int]]:
    """(rule → its job group, group → connected components per SLURM submission): the `group:`
    of the rules in rules/*.smk and in each study's rules.smk (in its package) and the
    `group-components` of the workflow profile (profiles/default; a group it does not name
    submits each component alone)."""
    import re
    from importlib import resources

    import yaml

    from dpmed.install import workflow_file
    from dpmed.studies import STUDIES

    files = sorted(workflow_file("rules").glob("*.smk"))
    files += [resources.files(f"dpmed.{study}").joinpath("rules.smk") for study in STUDIES]
    rules = {}
    for path in files:
        for block in re.split(r"^(?=rule \w+:)", path.read_text(), flags=re.M):
            found = re.match(r"rule (\w+):(?:.|\n)*?^\s+group:\s*\n?\s*\"(\w+)\"", block, re.M)
            if found:
                rules[found[1]] = found[2]
    profile = yaml.safe_load(workflow_file("profiles/default/config.yaml").read_text())
    sizes = dict(item.split("=") for item in profile.get("group-components", []))
    return rules, {group: int(n) for group, n in sizes.items()}


def submissions(counts: Counter[tuple[str, Request]]) -> int:
    """SLURM submissions of the jobs of `counts`: one per job outside a group; a group's jobs of
    one cell (a seg cell's training and attack) form one component, so a group has as many
    components as its most numerous rule has jobs, `group-components` of them per submission
    (`job_groups`). A lower bound: Snakemake bundles the components that are ready together."""
    rules, sizes = job_groups()
    jobs: Counter[str] = Counter()
    for (rule, _), n in counts.items():
        jobs[rule] += n
    alone = sum(n for rule, n in jobs.items() if rule not in rules)
    components: dict[str, int] = {}
    for rule, n in jobs.items():
        if rule in rules:
            components[rules[rule]] = max(components.get(rules[rule], 0), n)
    return alone + sum(math.ceil(n / sizes.get(g, 1)) for g, n in components.items())


def totals(config: Mapping[str, Any], counts: Counter[tuple[str, Request]]) -> str:
    """The grid's totals under the tables: requested CPU- and GPU-hours, jobs and SLURM
    submissions, and the GPU speedup the GPU hours rest on."""
    hours = grid_hours(config, counts)
    jobs = sum(counts.values())
    lines = [
        f"Grid total ({MODEL}, requested runtime × jobs): {hours['CPU']:,.0f} CPU-hours, "
        f"{hours['GPU']:,.0f} GPU-hours.",
        f"SLURM submissions: at least {submissions(counts):,} for its {jobs:,} jobs (the workflow "
        "profile's `group-components` bundles grouped jobs), plus the data preparation's.",
    ]
    if hours["GPU"]:
        speedup = float(config["resources"].get("gpu_speedup", 1.0))
        lines.append(
            f"GPU time assumes resources.gpu_speedup = {speedup:g} (an assumption, not a "
            "measurement)."
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the distinct requests of the grid `FILE ...` gives (as `--configfile FILE ...`;
    default config/config.yaml), largest first; with `--markdown` as the Markdown of
    `markdown`."""
    from dpmed.config.checks import checked_configs

    args = list(sys.argv[1:] if argv is None else argv)
    as_markdown = "--markdown" in args
    args = [arg for arg in args if arg != "--markdown"]
    _, config, grid = checked_configs("dpmed.job_cost", __doc__, args)
    counts = grid_requests(config, grid)
    if as_markdown:
        print(markdown(config, counts), end="")
        return 0
    print(f"{'rule':<11} {'mem_mb':>7} {'runtime':>11} {'GPU MB (at most)':>16}  jobs")
    for rule, req, n in requests_table(counts):
        gpu = str(req.gpu_mb) if req.gpu_mb else "-"
        capped = f"  (max_mem_mb cap; wants {req.uncapped_mem_mb})" if req.uncapped_mem_mb else ""
        print(f"{rule:<11} {req.mem_mb:>7} {req.runtime:>7} min {gpu:>16}  {n}{capped}")
    print(f"\n{totals(config, counts)}", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
