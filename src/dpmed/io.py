"""Atomic output writers: every file appears complete or not at all.

Each writer writes to a temporary sibling and renames it into place (atomic on POSIX), so a job
killed mid-write never leaves a half file that a later run would mistake for a result.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give normal permissions
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory next to `path`; it replaces `path` if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; give normal permissions
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_json(path: str | Path, obj: Any) -> None:
    """Write `obj` as indented, key-sorted JSON (stable bytes for identical content)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_npz(path: str | Path, **arrays: np.ndarray) -> None:
    """Write arrays to an uncompressed `.npz` atomically (deterministic bytes)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)


def write_csv(path: str | Path, frame: Any) -> None:
    """Write a pandas DataFrame as CSV (no index) atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, lineterminator="\n")
