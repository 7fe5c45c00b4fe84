"""What every training job needs: device choice, determinism, checkpoints and progress lines."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from dpmed.io import atomic_path


def select_device(name: str) -> torch.device:
    """`auto` → CUDA when available, else CPU; `cuda` fails loudly when there is none."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config device is 'cuda' but torch sees no CUDA device")
    return torch.device(name)


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed Python, NumPy and torch and ask torch for deterministic kernels, so one config gives
    identical results on one machine (CUDA's nondeterministic kernels then raise, not drift)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=torch.cuda.is_available())
    if threads is not None:
        torch.set_num_threads(max(1, threads))


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """torch.save `state` atomically: a job killed while saving keeps the previous checkpoint."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> dict | None:
    """The checkpoint at `path`, or None when there is none yet (a fresh run)."""
    path = Path(path)
    if not path.exists():
        return None
    return torch.load(path, map_location=device, weights_only=False)


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
