"""Read MATLAB `.mat` files of any version into plain Python/numpy values.

Two on-disk formats exist:

- v5/v7 (the default of MATLAB's `save`): read with `scipy.io.loadmat`.
- v7.3 (`save -v7.3`, HDF5 with a 512-byte MATLAB user block): read with `h5py`. HDF5 stores
  arrays with the dimension order reversed, so every numeric array is transposed back to MATLAB
  order; cell arrays are HDF5 object references into `#refs#` and are dereferenced.

Both paths return the same values for the same MATLAB variable:

- numeric / logical arrays: numpy arrays in MATLAB shape (never squeezed: a 1×1 scalar stays (1, 1),
  an H×W×B volume stays (H, W, B)); logical becomes bool;
- cell arrays: a Python `list` of their elements in MATLAB linear (column-major) order, each
  element converted recursively (so a 1×n cell of volumes is a list of n numpy arrays);
- char arrays: `str` for v7.3, scipy's string array for v5 (no loader here relies on them).

Only the requested variables are read, so a loader pays neither time nor memory for variables it
does not use (a Duke subject holds two 186 MB fluid volumes, one per grader).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import scipy.io

from dpmed.errors import DataFormatError

_MI_COMPRESSED = 15
_HDF5_INTERNAL = ("#refs#", "#subsystem#")


def load_mat(path: str | Path, required: Sequence[str]) -> dict[str, Any]:
    """Read the variables `required` from the MATLAB file `path` (v5 or v7.3).

    Returns {name: value} for exactly the required names (values as in the module docstring).
    Raises DataFormatError naming the file when it is missing, unreadable or truncated, or when a
    required variable is absent (the message lists the variables that are present).
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, "file not found")
    required = list(required)
    if h5py.is_hdf5(path):
        return _load_v73(path, required)
    return _load_v5(path, required)


def _missing_error(path: Path, missing: list[str], present: list[str]) -> DataFormatError:
    listed = ", ".join(sorted(present)) if present else "none"
    return DataFormatError(
        path, f"missing MATLAB variable(s) {', '.join(missing)} (variables present: {listed})"
    )


def _load_v5(path: Path, required: list[str]) -> dict[str, Any]:
    """Read a v4/v5/v7 file with scipy, after checking that it is not truncated."""
    try:
        major, _ = scipy.io.matlab.matfile_version(str(path))
        if major == 1:
            _check_v5_complete(path)
        raw = scipy.io.loadmat(str(path), variable_names=required, squeeze_me=False)
    except DataFormatError:
        raise
    except Exception as exc:  # scipy raises many types (ValueError, OSError, zlib.error, …)
        raise DataFormatError(path, f"not a readable MATLAB file ({exc})") from exc
    missing = [name for name in required if name not in raw]
    if missing:
        try:
            present = [name for name, _, _ in scipy.io.whosmat(str(path))]
        except Exception as exc:
            raise DataFormatError(path, f"not a readable MATLAB file ({exc})") from exc
        raise _missing_error(path, missing, present)
    return {name: _from_v5(raw[name]) for name in required}


def _check_v5_complete(path: Path) -> None:
    """Walk the top-level data-element tags of a v5 file; a tag pointing past the end of the
    file means the file was truncated (scipy only notices when it reads that variable)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        header = fh.read(128)
        endian = "<" if header[126:128] == b"IM" else ">"
        pos = 128
        while pos < size:
            fh.seek(pos)
            tag = fh.read(8)
            if len(tag) < 8:
                raise DataFormatError(path, f"truncated MATLAB file (incomplete tag at byte {pos})")
            mdtype, nbytes = struct.unpack(endian + "II", tag)
            end = pos + 8 + nbytes
            if mdtype != _MI_COMPRESSED:
                end += -end % 8
            if end > size:
                raise DataFormatError(
                    path, f"truncated MATLAB file (element at byte {pos} ends at {end} > {size})"
                )
            pos = end


def _from_v5(value: Any) -> Any:
    """Convert scipy's cell arrays (object arrays) to lists, recursively."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [_from_v5(item) for item in value.ravel(order="F")]
    return value


def _load_v73(path: Path, required: list[str]) -> dict[str, Any]:
    """Read a v7.3 (HDF5) file with h5py."""
    try:
        with h5py.File(path, "r") as handle:
            present = [key for key in handle.keys() if key not in _HDF5_INTERNAL]
            missing = [name for name in required if name not in present]
            if missing:
                raise _missing_error(path, missing, present)
            return {name: _from_hdf5(handle, handle[name]) for name in required}
    except DataFormatError:
        raise
    except Exception as exc:  # h5py raises OSError/KeyError/ValueError on damaged files
        raise DataFormatError(path, f"not a readable MATLAB v7.3 file ({exc})") from exc


def _matlab_class(node: h5py.HLObject) -> str:
    cls = node.attrs.get("MATLAB_class", b"")
    return cls.decode() if isinstance(cls, bytes) else str(cls)


def _from_hdf5(handle: h5py.File, node: h5py.HLObject) -> Any:
    """Convert one HDF5 node written by MATLAB to MATLAB-ordered numpy values / lists / dicts."""
    if isinstance(node, h5py.Group):  # a struct: one child per field
        return {key: _from_hdf5(handle, child) for key, child in node.items()}
    cls = _matlab_class(node)
    if node.attrs.get("MATLAB_empty", 0):
        return [] if cls == "cell" else np.zeros((0, 0))
    data = node[()]
    if h5py.check_dtype(ref=node.dtype) is not None:
        # HDF5 shape is MATLAB's reversed, so C order here is MATLAB's column-major order.
        return [_from_hdf5(handle, handle[ref]) for ref in np.asarray(data).ravel()]
    data = np.asarray(data)
    if data.dtype.names == ("real", "imag"):
        data = data["real"] + 1j * data["imag"]
    data = data.T
    if cls == "char":
        return "".join(chr(code) for code in data.ravel(order="F"))
    if cls == "logical":
        return data.astype(bool)
    return data
