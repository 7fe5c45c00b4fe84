"""NIfTI read/write with errors that name the file (nibabel raises bare EOF/zlib errors)."""

from __future__ import annotations

import zlib
from pathlib import Path

import nibabel as nib
import numpy as np

from dpmed.errors import DataFormatError
from dpmed.io import atomic_path


def read_nifti(path: str | Path, dtype: type | None = None) -> np.ndarray:
    """Read a `.nii`/`.nii.gz` volume fully into memory as an array in nibabel's axis order.

    A missing, truncated or corrupt file raises `DataFormatError` naming it. `dtype` casts the
    stored values (e.g. `np.float32` for images); labels should be read with `dtype=None`.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, "file is missing")
    try:
        img = nib.load(str(path))
        data = np.asarray(img.dataobj)
    except (EOFError, OSError, zlib.error, ValueError, nib.filebasedimages.ImageFileError) as exc:
        raise DataFormatError(path, f"cannot read NIfTI (truncated or corrupt?): {exc}") from exc
    if dtype is not None:
        data = data.astype(dtype, copy=False)
    return data


def write_nifti(path: str | Path, data: np.ndarray, spacing_mm: float = 1.0) -> None:
    """Write `data` as NIfTI-1 with an isotropic diagonal affine, atomically.

    nibabel writes gzip headers with mtime 0, so identical arrays give identical bytes.
    """
    path = Path(path)
    affine = np.diag([spacing_mm, spacing_mm, spacing_mm, 1.0])
    image = nib.Nifti1Image(np.asarray(data), affine)
    suffix = ".nii.gz" if path.name.endswith(".nii.gz") else ".nii"
    with atomic_path(path) as tmp:
        target = tmp.with_name(tmp.name + suffix)
        try:
            nib.save(image, str(target))
            target.replace(tmp)
        finally:
            target.unlink(missing_ok=True)
