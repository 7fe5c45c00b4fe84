"""Read `.npz` archives with errors that name the file and the bad array.

numpy raises bare zipfile/zlib errors for a damaged archive. zipfile checks a member's CRC-32
once the member has been read to its end, so every array is read to exactly its end here.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from dpmed.errors import DataFormatError

_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def read_npz(path: str | Path, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Arrays `keys` (every array when None) of the npz at `path`, read fully, no pickles.

    A missing, truncated or corrupt file (bad zip structure, bad CRC-32 or deflate data of a
    member read), or a missing key, raises `DataFormatError` naming the file (and the array).
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, "file is missing")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as fh:
            npy = fh.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX
        problem = "a single .npy array?" if npy else "truncated or corrupt"
        raise DataFormatError(path, f"not an npz archive ({problem})")
    try:
        with zipfile.ZipFile(path) as archive:
            members = {n.removesuffix(".npy"): n for n in archive.namelist() if n.endswith(".npy")}
            wanted = list(members) if keys is None else list(keys)
            missing = [key for key in wanted if key not in members]
            if missing:
                raise DataFormatError(path, f"missing arrays {missing} (has {sorted(members)})")
            return {key: _read_member(path, archive, members[key]) for key in wanted}
    except DataFormatError:
        raise
    except _READ_ERRORS as exc:
        raise DataFormatError(path, f"unreadable npz (truncated or corrupt): {exc}") from exc


def _read_member(path: Path, archive: zipfile.ZipFile, name: str) -> np.ndarray:
    """One `.npy` member, read to its end so zipfile verifies its CRC-32."""
    try:
        with archive.open(name) as fh:
            array = np.lib.format.read_array(fh, allow_pickle=False)
            if fh.read(1):
                raise ValueError("bytes left after the array")
    except _READ_ERRORS as exc:
        raise DataFormatError(path, f"array {name} is corrupt or truncated: {exc}") from exc
    return array
