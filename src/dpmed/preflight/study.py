"""What a study gives the preflight (`StudyProbe`, its optional `dpmed.<study>.probe:PROBE`,
loaded only when a preflight runs), σ for every ε of a cell by the study's own calibration,
the measuring tools its probes share, and the child process one cell's probe runs in:

    python -m dpmed.preflight.study SPEC.json RESULT.json

SPEC.json: {"probe" (a probe of the study's `StudyProbe.probes`), "study", "wildcards",
"params", "seed", "device", "steps", "config" (the data section is read), "data_dir" (the
study's stand-in processed data, if it has any), "work_dir"}.
RESULT.json: the probe's measures, `status` ok or error with the message, `peak_rss_mb` (the
process's own high-water mark, `dpmed.peak_memory`) and on CUDA `peak_cuda_mb`
(torch.cuda.max_memory_allocated): the child's peak memory is its own.

A study's probes build its job as its runner does (`<study>.run.prepare`) at the configured
size and step it through the runner's own functions `steps` times, each step timed;
`seconds_per_step` is the median of the steps after the first (the first pays for allocation
and warm-up). Its calibration
gives σ for one ε by the runner's own code on counts-only data; its stand-in data is random
arrays in its processed format (the probes read them as the runner reads processed data).

Calibration needs only counts (the sampling rate q and the number of steps, or the updates a
server round holds), so it runs in the preflight's own process, for every distinct cell and ε
of the grid, before any probe. Each study calibrates by its runner's own code
(`StudyProbe.calibrate`: seg's `Plan` and accountant, xcal's self-calibrating `Client`s, fets'
server) and checks the σ against the target; a paper approximation without a guarantee
reports its noise multiplier with an empty check.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpmed.config.grid import Job, job_seed
from dpmed.config.wildcards import parse_eps
from dpmed.io import write_text
from dpmed.peak_memory import peak_rss_bytes
from dpmed.sizing import study_sizing
from dpmed.studies import STUDIES, part_module, study_part

if TYPE_CHECKING:
    import torch

    from dpmed.runtime import JobContext

CELL_FILE = "cell.json"  # per probed cell, in the preflight's logs/<index>/ folder


def study_rules() -> dict[str, tuple[str, ...]]:
    """study → the job_cost rules its cells are priced under, for every registered study with a
    preflight probe (`dpmed.<study>.probe`)."""
    return {
        study: tuple(study_sizing(study).rules) for study in STUDIES if part_module(study, "probe")
    }


def probe_key(cell: Cell) -> tuple:
    """The key of cells one probe measures: the study and its sizing's `probe_key`."""
    return (cell.study, *study_sizing(cell.study).probe_key(cell.key[1:]))


def shared_key(cell: Cell) -> tuple | None:
    """The key of the part of `cell`'s probe that no method changes, measured once for every
    cell with that key (None: the study's probe has no such part)."""
    key = study_sizing(cell.study).shared_key
    return None if key is None else (cell.study, *key(cell.job.wc, cell.job.params))


@dataclass
class Cell:
    """One distinct cell: its representative job (the first in grid order), every job it
    stands for and the distinct finite ε of those jobs (each gets its own σ)."""

    study: str
    key: tuple
    job: Job
    jobs: list[Job] = field(default_factory=list)

    @property
    def name(self) -> str:
        """A readable id, unique in a grid: the representative's wildcards without seed and ε,
        and `/nonprivate` for a cell of ε = inf (xcal's centralized cells differ in nothing
        else)."""
        wc = {k: v for k, v in self.job.wc.items() if k not in ("seed", "eps")}
        private = any(math.isfinite(eps) for eps in self.eps)
        return f"{self.study}/" + "/".join(wc.values()) + ("" if private else "/nonprivate")

    @property
    def eps(self) -> list[float]:
        """The distinct ε of the cell's jobs, ascending (inf for a non-private cell)."""
        return sorted({parse_eps(job.wc["eps"]) for job in self.jobs})


def rule_jobs(cell: Cell, rule: str) -> list[Job]:
    """The jobs of `cell` that run `rule` (the rule's sizing says which, e.g. seg_attack only
    in blocks with the attack on)."""
    return study_sizing(cell.study).rules[rule].runs(cell.jobs)


# A probe's input (SPEC.json) → its measures.
Probe = Callable[[dict[str, Any]], dict[str, Any]]
RTOL = 1e-9  # slack of the ε ≤ target check (float rounding of the accountant)


@dataclass(frozen=True)
class Calibration:
    """σ of one (cell, ε): the noise multiplier (smallest and largest over a federation's
    clients), the accounted ε, and whether it is within the target (None: no guarantee to
    check: non-private, or a paper approximation)."""

    eps: float
    sigma_min: float | None
    sigma_max: float | None
    accounted: float | None
    ok: bool | None
    note: str = ""


def job_context(job: Job, processed: Path = Path("."), out: Path = Path(".")) -> JobContext:
    """The JobContext the workflow would give grid job `job` (its seed), on CPU."""
    from dpmed.runtime import JobContext  # torch: the workflow imports this module

    return JobContext(processed, out, job.wc, job.params, job_seed(job.study, job.wc), "cpu")


@dataclass(frozen=True)
class ProbePart:
    """One child process of a cell's probe.

    Args:
        folder: its folder below the cell's log folder ("": that folder itself).
        probe: the name of its probe in `StudyProbe.probes`.
        shared: the part no method changes: it runs once for all cells of one
            `dpmed.preflight.run.shared_key` (the study's sizing says what it depends on),
            its measures serving each.
    """

    folder: str
    probe: str
    shared: bool = False


@dataclass(frozen=True)
class StudyProbe:
    """A study's preflight.

    Args:
        parts: the child processes of one cell's probe, in the order they run (their measures
            merge, later parts winning a key both have).
        probes: probe name → probe (SPEC.json → measures: `seconds_per_step`, `parameters`,
            `sigma`, ...: what the cost projection reads).
        calibrate: (config, job, ε) → σ for one private ε of `job` and its check.
        data_name: the stand-in data a job's probes read, from its wildcards (None: its
            probes make their own in-process).
        write_data: (config, data name, folder) → writes that stand-in data into the folder.
    """

    parts: tuple[ProbePart, ...]
    probes: Mapping[str, Probe]
    calibrate: Callable[[Mapping[str, Any], Job, float], Calibration]
    data_name: Callable[[Mapping[str, str]], str] | None = None
    write_data: Callable[[Mapping[str, Any], str, Path], Path] | None = None


def study_probe(study: str) -> StudyProbe:
    """The `StudyProbe` of `study` (`dpmed.<study>.probe:PROBE`), imported now."""
    return study_part(study, "probe", "PROBE")


def calibrate(config: Mapping[str, Any], cell: Cell) -> list[Calibration]:
    """σ and its check for every ε of `cell` (one row at ε = inf for a non-private cell), each
    from the cell's first job at that ε; a calibration that fails is a row with ok False and
    the error in its note."""
    study = study_probe(cell.study)
    out = []
    for eps in cell.eps:
        if math.isinf(eps):
            out.append(Calibration(eps, None, None, None, None, "non-private"))
            continue
        job = next(job for job in cell.jobs if parse_eps(job.wc["eps"]) == eps)
        try:
            out.append(study.calibrate(config, job, eps))
        except (ValueError, RuntimeError) as err:
            out.append(Calibration(eps, None, None, None, False, f"{type(err).__name__}: {err}"))
    return out


def probe_job(spec: Mapping[str, Any], processed: Path) -> JobContext:
    """The job a probe's SPEC.json describes, reading `processed` and writing its work folder."""
    from dpmed.runtime import JobContext

    return JobContext(processed, Path(spec["work_dir"]), spec["wildcards"], spec["params"],
                      int(spec["seed"]), spec["device"])  # fmt: skip


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so that a timing covers it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(call: Callable[[], Any], device: torch.device) -> float:
    """Seconds `call` takes, its device work included."""
    start = time.perf_counter()
    call()
    synchronize(device)
    return time.perf_counter() - start


def steady(times: Sequence[float]) -> float:
    """Seconds per step: the median of the steps after the first (all, if only one)."""
    return float(statistics.median(times[1:] if len(times) > 1 else times))


def parameters(module: torch.nn.Module) -> int:
    """The module's trainable parameters."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def run_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """The probe's measures with `status`, or status `error` and the message; peaks added."""
    import torch

    try:
        probe = study_probe(spec["study"]).probes[spec["probe"]]
        result = {"status": "ok", **probe(spec)}
    except Exception as err:  # noqa: BLE001  (every failure of a cell is reported, not raised)
        traceback.print_exc()
        result = {"status": "error", "message": f"{type(err).__name__}: {err}"}
    result["peak_rss_mb"] = peak_rss_bytes() / 1e6
    result["device"] = "cuda" if spec["device"] != "cpu" and torch.cuda.is_available() else "cpu"
    if result["device"] == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 1e6
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the probe SPEC.json names and write RESULT.json (module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m dpmed.preflight.study",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", metavar="SPEC.json", help="the probe to run")
    parser.add_argument("result", metavar="RESULT.json", help="where its result goes")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    write_text(args.result, json.dumps(run_probe(spec), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
