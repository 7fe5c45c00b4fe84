"""NIfTI read/write with errors that name the file (nibabel raises bare EOF/zlib errors, and
stops reading a `.nii.gz` before the gzip trailer, so it never notices a CRC mismatch)."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np

from dpmed.errors import DataFormatError
from dpmed.io import atomic_path


def read_nifti(path: str | Path, dtype: type | None = None) -> np.ndarray:
    """Read a `.nii`/`.nii.gz` volume fully into memory as an array in nibabel's axis order.

    A missing, truncated or corrupt file raises `DataFormatError` naming it; a `.gz` file is
    decompressed to its end first, so its CRC-32 and length trailer are checked. `dtype` casts the
    stored values (e.g. `np.float32` for images); labels should be read with `dtype=None`.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, "file is missing")
    try:
        img = _load_gz(path) if path.suffix == ".gz" else nib.load(str(path))
        data = np.asarray(img.dataobj)
    except DataFormatError:
        raise
    except (EOFError, OSError, zlib.error, ValueError, nib.filebasedimages.ImageFileError) as exc:
        raise DataFormatError(path, f"cannot read NIfTI (truncated or corrupt?): {exc}") from exc
    if dtype is not None:
        data = data.astype(dtype, copy=False)
    return data


def _load_gz(path: Path) -> nib.Nifti1Image:
    """Decompress the whole gzip stream (the gzip module verifies its CRC-32 and length at the
    end) and parse the NIfTI-1 or NIfTI-2 image from the decompressed bytes."""
    try:
        with gzip.open(path, "rb") as stream:
            raw = stream.read()
    except (EOFError, OSError, zlib.error) as exc:
        raise DataFormatError(path, f"corrupt or truncated gzip stream: {exc}") from exc
    for image_class in (nib.Nifti1Image, nib.Nifti2Image):
        header = image_class.header_class
        if header.may_contain_header(raw[: header.sizeof_hdr]):
            return image_class.from_bytes(raw)
    raise DataFormatError(path, "not a NIfTI-1 or NIfTI-2 volume (no valid header)")


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
