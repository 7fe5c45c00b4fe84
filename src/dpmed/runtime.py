"""What every training job needs: its context, device choice, determinism, its checkpoint
and progress lines.

The three training runners (`dpmed.seg.run`, `dpmed.fets.run`, `dpmed.xcal.run`) share one
shape: `run(job: JobContext)` reads the job, builds data and model, resumes from
`job.checkpoint(study)` when its identity matches (`dpmed.checkpoint`), loops over
epochs/rounds (one `Progress` line and one `Checkpoint.save` each), evaluates and writes its
outputs atomically, then removes the checkpoint. Each also writes `config.json`
(`JobContext.write_config`) and, when the config sets `logging.tensorboard`, TensorBoard events
(`dpmed.tracking`). Determinism on CPU and CUDA and its exceptions: docs/reproducibility.md.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

import dpmed
from dpmed.allocator import keep_freed_memory
from dpmed.checkpoint import CHECKPOINT, Checkpoint, job_identity
from dpmed.io import write_json

# The run folder's record of what the job ran with (`JobContext.write_config`).
RUN_CONFIG = "config.json"
# cuBLAS reserves fixed workspaces with this setting, so its GEMMs are reproducible (NVIDIA's
# cuBLAS docs, "Results reproducibility"); PyTorch refuses CUDA matmuls in deterministic mode
# without it (or the smaller `:16:8`).
CUBLAS_WORKSPACE = ":4096:8"


def select_device(name: str) -> torch.device:
    """`auto` → CUDA when available, else CPU; `cuda` fails loudly when there is none."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config device is 'cuda' but torch sees no CUDA device")
    return torch.device(name)


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed Python, NumPy and torch and make torch deterministic, so one config gives identical
    results on one machine: deterministic kernels only (an op without one raises, it never
    drifts silently), cuDNN without benchmarking, and cuBLAS with a fixed workspace. Call it
    before the job's first CUDA operation: cuBLAS reads `CUBLAS_WORKSPACE_CONFIG` when PyTorch
    first uses it (a value the user set is kept)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    use_deterministic_algorithms()
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    if threads is not None:
        torch.set_num_threads(max(1, threads))


def use_deterministic_algorithms() -> None:
    """`torch.use_deterministic_algorithms(True)` without its import of `torch._inductor`
    (1.7 s of every job's start on CPU, for a compiler no job uses): the same C++ flag, and
    inductor's own flag as well when something has imported inductor."""
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = True
    torch._C._set_deterministic_algorithms(True, warn_only=False)


@dataclass(frozen=True)
class JobContext:
    """One training job as its rule states it.

    Args:
        processed_dir: the processed data folder the job reads.
        out_dir: the job's run folder (outputs and checkpoint).
        wildcards: the job's wildcards (study axes).
        params: resolved hyperparameters (study defaults + block params).
        seed: the job seed (stable hash of the wildcards).
        device: `auto`, `cpu` or `cuda`.
        threads: torch CPU threads (None: torch's default).
        tensorboard: write TensorBoard events under `<out_dir>/tensorboard/` (config
            `logging.tensorboard`; not part of the job's identity or outputs).
    """

    processed_dir: Path
    out_dir: Path
    wildcards: Mapping[str, str]
    params: Mapping[str, Any]
    seed: int
    device: str = "auto"
    threads: int | None = None
    tensorboard: bool = False

    def checkpoint(self, study: str) -> Checkpoint:
        """The job's checkpoint file, tagged with its identity (params, data and `study`'s
        code): a checkpoint of another job, data or code is never resumed."""
        identity = job_identity(study, self.processed_dir, self.wildcards, self.params, self.seed)
        return Checkpoint(Path(self.out_dir) / CHECKPOINT, identity)

    def start(self) -> torch.device:
        """Create the run folder, keep freed memory in the process (`dpmed.allocator`), seed
        every RNG, pick the device."""
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        keep_freed_memory()
        seed_everything(self.seed, self.threads)
        return select_device(self.device)

    def write_config(self, study: str, device: torch.device) -> dict[str, Any]:
        """Write `config.json` into the run folder and return it: what the job ran with (study,
        wildcards, seed, every resolved hyperparameter, the device asked for and the one used,
        CPU threads and the dpmed/torch/CUDA versions). No timestamps or host names, so a rerun
        of one config on one machine writes the same bytes; the device used and the versions
        belong to the record (a CUDA run does not give a CPU run's numbers)."""
        record = {
            "study": study,
            "wildcards": dict(self.wildcards),
            "seed": int(self.seed),
            "hyperparameters": dict(self.params),
            "device": {"requested": self.device, "used": str(device)},
            "threads": self.threads,
            "versions": {
                "dpmed": dpmed.__version__,
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
            },
        }
        write_json(Path(self.out_dir) / RUN_CONFIG, record)
        return record


def job_from_snakemake(smk: Any) -> JobContext:
    """The JobContext of a training rule: `params.processed`, `params.hp`, `params.seed`,
    `params.device`, the first output's folder, the rule's threads and the config's
    `logging.tensorboard` (read from the config, not a param, so switching it reruns nothing)."""
    return JobContext(
        processed_dir=Path(smk.params.processed),
        out_dir=Path(smk.output[0]).parent,
        wildcards=dict(smk.wildcards.items()),
        params=smk.params.hp,
        seed=int(smk.params.seed),
        device=smk.params.device,
        threads=smk.threads,
        tensorboard=bool(smk.config["logging"]["tensorboard"]),
    )


class Progress:
    """One line per epoch/round: metrics, ε spent so far, elapsed time and ETA.

    `start` is the index of the first unit run by this process (a resumed run), so the ETA uses
    only the units timed here.
    """

    def __init__(self, label: str, total: int, start: int = 0, stream: TextIO | None = None):
        self.label, self.total, self.start = label, total, start
        self.stream = stream if stream is not None else sys.stdout
        self._t0 = time.perf_counter()

    def line(self, done: int, metrics: dict[str, float], epsilon: float | None) -> str:
        """Format (and print) the line after unit `done` (1-based) of `total`."""
        elapsed = time.perf_counter() - self._t0
        per_unit = elapsed / max(1, done - self.start)
        eta = per_unit * (self.total - done)
        parts = [f"[{self.label}] {done}/{self.total}"]
        parts += [f"{k}={v:.4g}" for k, v in metrics.items()]
        parts.append("eps=inf" if epsilon is None else f"eps={epsilon:.4g}")
        parts.append(f"elapsed={_clock(elapsed)} eta={_clock(eta)}")
        text = " ".join(parts)
        print(text, file=self.stream, flush=True)
        return text


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
