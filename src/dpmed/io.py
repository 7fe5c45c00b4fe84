"""Atomic output writers: every file appears complete or not at all.

Each writer writes to a temporary sibling and renames it into place (atomic on POSIX), so a job
killed mid-write never leaves a half file that a later run would mistake for a result.
"""

from __future__ import annotations

import contextlib
import glob
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


_SUFFIX = ".tmp"
_RANDOM_CHARS = 8  # the length of the random part `tempfile` puts in a name


def _prefix(path: Path) -> str:
    return f".{path.name}."


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporary siblings (`.<name>.<8 random characters>.tmp`, files or folders)
    that a writer of `path` killed before its rename left behind, and return them.

    Only call this where no other process writes `path` at the same time (a Snakemake job
    rebuilding its own output): a live writer's temporary has the same name pattern. The
    random part has a fixed length, so another output's temporaries never match (`.a.b.…` is
    not `.a.`'s)."""
    path = Path(path)
    return _remove_temporaries(path.parent, glob.escape(_prefix(path)))


def remove_folder_temporaries(folder: str | Path) -> list[Path]:
    """Remove the temporaries of every writer in `folder` (`.<any name>.<8 random
    characters>.tmp`, not below it) and return them: what a job killed while writing its run
    folder left there. Only for a folder one job writes (its run folder, as it starts)."""
    return _remove_temporaries(Path(folder), ".*.")


def _remove_temporaries(folder: Path, prefix: str) -> list[Path]:
    """Remove the temporaries in `folder` whose name is the glob `prefix`, the random part and
    the suffix; return them."""
    stale = sorted(folder.glob(prefix + "?" * _RANDOM_CHARS + glob.escape(_SUFFIX)))
    for tmp in stale:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp)
        else:
            tmp.unlink(missing_ok=True)
    return stale


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_prefix(path), suffix=_SUFFIX, dir=path.parent)
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
    tmp = Path(tempfile.mkdtemp(prefix=_prefix(path), suffix=_SUFFIX, dir=path.parent))
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


def write_npy(path: str | Path, array: np.ndarray) -> None:
    """Write one array as `.npy` atomically (memory-mappable, deterministic bytes)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, array)


def write_csv(path: str | Path, frame: Any) -> None:
    """Write a pandas DataFrame as CSV (no index) atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, lineterminator="\n")
