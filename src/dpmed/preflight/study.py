"""What a study gives the preflight (`StudyProbe`, its optional `dpmed.<study>.probe:PROBE`,
loaded only when a preflight runs) and the measuring tools its probes share.

A study's probes build its job as its runner does (`<study>.run.prepare`) at the configured
size and time a few real steps in a child process (`dpmed.preflight.probe`); its calibration
gives σ for one ε by the runner's own code on counts-only data; its stand-in data is random
arrays in its processed format (the probes read them as the runner reads processed data).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpmed.config.grid import Job, job_seed
from dpmed.studies import study_part

if TYPE_CHECKING:
    import torch

    from dpmed.runtime import JobContext

# A probe's input (SPEC.json of `dpmed.preflight.probe`) → its measures.
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
            `dpmed.preflight.cells.shared_key` (the study's sizing says what it depends on),
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
