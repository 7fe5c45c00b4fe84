"""Raw-data manifests: the files of a raw folder, so that preprocessing depends on their contents.

Snakemake dates a folder input by the folder's own mtime (or its `.snakemake_timestamp`), which
overwriting a file inside the folder leaves unchanged. The preprocessing rules therefore also
read `data/manifests/<dataset>.tsv`, one row per file of the raw folder (path relative to it,
size in bytes, and a fingerprint of its contents), which the workflow rewrites at every DAG
build when, and only when, the rows changed; a rewritten manifest is newer than the processed
data, so preprocessing and everything downstream rerun.

The fingerprint is the file's sha256 when the whole folder holds at most `HASH_LIMIT` bytes (the
synthetic data: identical data give identical manifests), else its mtime in nanoseconds: hashing
a real release (FeTS is gigabytes) at every DAG build would take too long, so there a file that
is touched without being changed also reruns preprocessing, and one rewritten with its old
mtime restored (`cp -p`, `touch -d`) goes unseen.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dpmed.io import write_text

HASH_LIMIT = 64 * 2**20
# Snakemake's own mtime carrier inside a folder it wrote (rewritten when it dates the folder).
IGNORED = frozenset({".snakemake_timestamp"})


def manifest_path(dataset: str) -> str:
    """Where the manifest of `dataset`'s raw folder lives (relative to the working folder)."""
    return f"data/manifests/{dataset}.tsv"


def raw_files(folder: str | Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every file below `folder`, symlinks followed, sorted."""
    root = Path(folder)
    found = []
    for parent, dirs, names in os.walk(root, followlinks=True):
        dirs.sort()
        for name in names:
            path = Path(parent) / name
            relative = path.relative_to(root).as_posix()
            if relative not in IGNORED:
                found.append((relative, path))
    return sorted(found)


def manifest_text(folder: str | Path) -> str:
    """The manifest of `folder` (module docstring): a header `path, size, sha256|mtime_ns`, then
    one tab-separated row per file."""
    stats = [(relative, path, path.stat()) for relative, path in raw_files(folder)]
    hashed = sum(st.st_size for _, _, st in stats) <= HASH_LIMIT
    rows = ["path\tsize\t" + ("sha256" if hashed else "mtime_ns")]
    for relative, path, st in stats:
        if hashed:
            with open(path, "rb") as handle:
                fingerprint = hashlib.file_digest(handle, "sha256").hexdigest()
        else:
            fingerprint = str(st.st_mtime_ns)
        rows.append(f"{relative}\t{st.st_size}\t{fingerprint}")
    return "\n".join(rows) + "\n"


def write_manifest(folder: str | Path, path: str | Path) -> None:
    """Write the manifest of `folder` to `path` (atomically, also when unchanged: the rule
    that runs this must leave its output newer than the folder)."""
    write_text(path, manifest_text(folder))


def refresh_manifest(folder: str | Path, path: str | Path) -> bool:
    """Rewrite the manifest at `path` if `folder` exists and its rows differ from the file's;
    an unchanged manifest keeps its bytes and mtime. Returns whether it was written."""
    if not Path(folder).is_dir():
        return False
    text = manifest_text(folder)
    target = Path(path)
    if target.is_file() and target.read_text() == text:
        return False
    write_text(target, text)
    return True
