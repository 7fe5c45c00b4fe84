"""Resumable job state that never resumes another job and never runs code when loaded.

A checkpoint is written atomically after every epoch/round and removed once the job's outputs
exist; loading it, as a job starts, first removes what killed writes left in the run folder
(`.checkpoint.pt.<random>.tmp` and its outputs' temporaries). It carries the job's identity,
three digests that a resume must match:

- `job`: the wildcards, resolved params and seed;
- `data`: the content of the processed data folder the job reads (every file, hashed);
- `code`: the package version plus a hash of the study's source files (its own package and the
  shared core; the other studies' packages are left out).

A mismatch in any of them, or a file that is not a plain-tensor checkpoint, discards the
checkpoint with a log line saying why. Files are read with `torch.load(weights_only=True)`, so a
planted pickle payload is refused without running; they hold tensors and plain data only (NumPy
arrays are stored as tensors and NumPy scalars as Python numbers). Saved bytes are identical for
identical states (the zip root is fixed, not named after the temporary file).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import pickle
import random
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import dpmed
from dpmed.io import atomic_path, remove_folder_temporaries

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class JobIdentity:
    """What a checkpoint must match to be resumed (see the module docstring)."""

    job: str
    data: str
    code: str

    def mismatches(self, saved: Mapping[str, Any] | None) -> list[str]:
        """Why a checkpoint saved under `saved` is not this job's (empty when it is)."""
        if not isinstance(saved, Mapping):
            return ["it records no job identity"]
        reasons = {
            "job": "the job's wildcards, params or seed changed",
            "data": "its input data changed",
            "code": f"the code changed ({saved.get('code')} → {self.code})",
        }
        return [text for key, text in reasons.items() if saved.get(key) != getattr(self, key)]


def job_identity(
    study: str, processed_dir: Path, wildcards: Mapping, params: Mapping, seed: int
) -> JobIdentity:
    """The identity of one job of `study` reading `processed_dir`: sha256 of the job as
    key-sorted JSON, of every file below the data folder, and `code_version`."""
    job = {"wildcards": dict(wildcards), "params": dict(params), "seed": seed}
    data = Path(processed_dir)
    return JobIdentity(
        job=hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest(),
        data=files_digest(data, [p for p in data.rglob("*") if p.is_file()]),
        code=code_version(study),
    )


def files_digest(root: Path, paths: Iterable[Path]) -> str:
    """sha256 over `paths` (files below `root`): relative path and content hash, in path order."""
    total = hashlib.sha256()
    for path in sorted(paths):
        with open(path, "rb") as handle:
            content = hashlib.file_digest(handle, "sha256").hexdigest()
        total.update(f"{path.relative_to(root).as_posix()}\0{content}\n".encode())
    return total.hexdigest()


@functools.cache
def code_version(study: str) -> str:
    """`<package version>+<12 hex of the sources>`: the study's package and the shared core
    (every module of `dpmed` outside the other studies' packages)."""
    root = Path(dpmed.__file__).parent
    others = {p.parent.name for p in root.glob("*/spec.py")} - {study}
    sources = [p for p in root.rglob("*.py") if p.relative_to(root).parts[0] not in others]
    return f"{dpmed.__version__}+{files_digest(root, sources)[:12]}"


def rng_state() -> dict[str, Any]:
    """The global RNG states (Python, NumPy, torch, CUDA) as tensors and plain data."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python_rng": random.getstate(),
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what `rng_state` saved."""
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    kind, keys, pos, has_gauss, gauss = state["numpy_rng"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python_rng"]
    random.setstate((version, tuple(internal), gauss_next))


@dataclass(frozen=True)
class Checkpoint:
    """A job's resumable state: saved after every epoch/round with the job's identity and the
    global RNG states, loaded only by the same job on the same data and code."""

    path: Path
    identity: JobIdentity

    def load(self) -> dict[str, Any] | None:
        """The saved state (on the CPU: `load_state_dict` copies weights to the model's device,
        and RNG states must stay CPU tensors) with the RNGs restored, or None for a fresh run:
        no checkpoint, or one that is unsafe, unreadable or of another job (said on stdout).
        First removes the temporaries that a killed run of the job left in its run folder
        (`.checkpoint.pt.<random>.tmp` and those of its outputs' atomic writes)."""
        for stale in remove_folder_temporaries(self.path.parent):
            print(f"{stale}: removed, left by a killed write", flush=True)
        if not self.path.exists():
            return None
        try:
            state = load_state(self.path)
        except CheckpointRefused as refused:
            print(f"{self.path}: {refused}; starting afresh", flush=True)
            return None
        reasons = self.identity.mismatches(state.get("identity"))
        if reasons:
            print(f"{self.path}: not resumed because {'; '.join(reasons)}", flush=True)
            return None
        set_rng_state(state["rng"])
        return state

    def save(self, state: Mapping[str, Any]) -> None:
        """Save `state` plus the identity and the global RNG states."""
        save_state(self.path, {**state, "identity": asdict(self.identity), "rng": rng_state()})

    def remove(self) -> None:
        """Delete the checkpoint once the outputs exist."""
        self.path.unlink(missing_ok=True)


class CheckpointRefused(Exception):
    """A file is not a loadable plain-tensor state (a pickle payload, truncated, not torch)."""


def save_state(path: str | Path, state: Mapping[str, Any]) -> None:
    """torch.save `state` (made plain: NumPy → tensors/Python numbers) atomically and with bytes
    that depend only on the state: a job killed while saving keeps the previous file."""
    buffer = io.BytesIO()  # a file-like target names the zip root `archive`, not the temp file
    torch.save(plain(state), buffer)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getvalue())


def load_state(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """What `save_state` wrote, on the CPU, loaded without running pickled code; raises
    `CheckpointRefused` naming the reason for anything else (`check_records` first). `mmap`:
    the tensors map the file's bytes instead of copies, so nothing is allocated for them until
    they are read."""
    check_records(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointRefused(f"refused to load ({first})") from err
    if not isinstance(state, dict):
        raise CheckpointRefused(f"holds a {type(state).__name__}, not a state mapping")
    return state


def check_records(path: str | Path) -> None:
    """Raise `CheckpointRefused` for a file that is no zip archive or holds a compressed
    record: `torch.save` stores every record as it is, so a record's size never exceeds the
    file's, whereas a compressed one (a few MiB inflating to GiB) would be allocated in full
    before anything could check it. Reads only the archive's directory."""
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise CheckpointRefused(f"refused to load ({err})") from err
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED or record.file_size != record.compress_size:
            raise CheckpointRefused(
                f"refused to load: record {record.filename!r} is compressed "
                f"({record.compress_size:,} bytes declaring {record.file_size:,}); torch.save "
                "stores records uncompressed"
            )


def plain(value: Any) -> Any:
    """`value` with NumPy arrays as tensors and NumPy scalars as Python numbers, recursively
    (what `torch.load(weights_only=True)` accepts)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value
