"""Duke and UMN DME OCT: validating loaders, preprocessing and the overview panel.

Raw formats (read from any folder, synthetic or the real download; MATLAB v5
and v7.3 files both work, `load_mat`):

- duke: `Subject_*.mat` (Subject_01 … Subject_10), each with `images` (H×W×B, values 0–255),
  `manualLayers{g}` (8×W×B, 1-based row of each of the 8 Chiu boundaries ILM, RNFL/GCL,
  IPL/INL, INL/OPL, OPL/ONL, ISM/ISE, OS/RPE, RPE/choroid per A-scan column; NaN where not
  annotated) and `manualFluid{g}` (H×W×B, fluid ids > 0 = fluid), g = cfg["grader"] (1 or 2).
- umn: `UMNDataset.mat` with 1×n cell arrays `AllSubjects{i}` (H×W×B) and `ManualFluid{g}{i}`
  (H×W×B, > 0 = fluid). `AllSubjects` may hold one cell more than `ManualFluid{g}` (the
  release: 30 against 29): cell i pairs with annotation i, as public loaders of the file read
  it, and the last `AllSubjects` cell, which has no annotation, is dropped (reported on stdout
  and in meta.json notes). The file names no subject, so nothing else tells which cell lacks
  its annotation. Any other difference in length is an error.

Sample selection and labels:

- duke: the annotated B-scans are those where `manualLayers{g}` has any finite value. Each is
  cropped to the columns from the first to the last column where all 8 boundaries are finite;
  a boundary's NaN columns inside that span are filled by linear interpolation along columns.
  The 9-class mask is `layers_to_mask`: the boundaries are made monotone by a cumulative
  maximum from boundary 1 to 8 and rounded half up to integer rows b_k (1-based); a pixel in
  0-based row r gets the number n of boundaries with r ≥ b_k − 1, so class k lies between
  boundaries k and k+1 (k = 1…7), rows above b1 get 0 and rows from b8 down get 8 → 0
  (background below the RPE). Then every pixel with fluid > 0 becomes class 8, wherever it is
  (inside or outside the layers). NaN fluid inside an annotated B-scan counts as no fluid.
  Classes: 0 background, 1 RNFL, 2 GCL+IPL, 3 INL, 4 OPL, 5 ONL+ISM, 6 ISE+OS, 7 RPE, 8 fluid.
- umn: every B-scan of every subject; mask 1 = fluid (> 0), 0 = rest (NaN counts as 0).
  Subject i of the cell arrays is named `Subject_{i:02d}` (1-based).

Images must be finite and within 0–255; they are rounded to uint8 (the real files store them
as uint8 or as whole-valued doubles).

Processed format (both datasets), written to `out_dir`:

- `train.npz`, `val.npz`, `test.npz` (uncompressed), samples sorted by subject id then B-scan:
  - `images`: float32 (N, H, W) in [0, 1] — the uint8 B-scan (cropped for duke) resized to
    cfg["size"] = [H, W] with linear interpolation, divided by 255;
  - `masks`: uint8 (N, H, W) — class ids (duke 0–8, umn 0–1), resized by nearest neighbour;
  - `subjects`: (N,) str — subject id (file stem for duke, `Subject_XX` for umn);
  - `bscans`: (N,) int64 — 0-based B-scan index in the subject's source volume.
- `meta.json`: dataset, family "oct", format_version 1, classes {"value": name}, counts
  (images, subjects and images_with_class per class, per split), splits {split: subject ids},
  source_files (names relative to raw_dir), notes, size [H, W] and grader.

Splits are subject-level: `split_subjects(subject_ids, cfg["split"], cfg["split_seed"])`.

MATLAB files (`load_mat`): v5/v7 (MATLAB's default `save`) are read with `scipy.io.loadmat`,
v7.3 (`save -v7.3`, HDF5 with a 512-byte MATLAB user block) with `h5py`, whose arrays are
transposed back to MATLAB's dimension order and whose cell arrays (object references into
`#refs#`) are dereferenced. Both give the same values for the same variable: numeric / logical
arrays in MATLAB shape (never squeezed; logical as bool), cell arrays as a `list` of their
elements in MATLAB linear (column-major) order, converted recursively, and char arrays as `str`
(v7.3) or scipy's string array (v5; no loader relies on them). Only the requested variables are
read, so a loader pays nothing for variables it does not use (a Duke subject holds two 186 MB
fluid volumes, one per grader).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import scipy.io

from dpmed.data.common import CountRow, Panel, resize_image, resize_mask
from dpmed.data.npz import read_npz
from dpmed.data.splits import split_subjects
from dpmed.errors import ConfigError, DataFormatError
from dpmed.io import write_json, write_npz

FAMILY = "oct"
SPLITS = ("train", "val", "test")
N_BOUNDARIES = 8
FLUID_CLASS = 8
DUKE_CLASSES = {
    0: "background",
    1: "RNFL",
    2: "GCL+IPL",
    3: "INL",
    4: "OPL",
    5: "ONL+ISM",
    6: "ISE+OS",
    7: "RPE",
    8: "fluid",
}
UMN_CLASSES = {0: "background", 1: "fluid"}
UMN_FILE = "UMNDataset.mat"


@dataclass(frozen=True)
class BScan:
    """One labelled B-scan at source resolution: `image` uint8 (h, w), `mask` uint8 (h, w)."""

    subject: str
    bscan: int
    image: np.ndarray
    mask: np.ndarray


def classes_of(dataset: str) -> dict[int, str]:
    """Class value → name of `dataset` ("duke" or "umn")."""
    if dataset == "duke":
        return dict(DUKE_CLASSES)
    if dataset == "umn":
        return dict(UMN_CLASSES)
    raise ValueError(f"the OCT family holds 'duke' and 'umn', not '{dataset}'")


def layers_to_mask(boundaries: np.ndarray, fluid: np.ndarray, height: int) -> np.ndarray:
    """Build the 9-class Duke mask (height, W) uint8 of one B-scan.

    `boundaries` (8, W): finite 1-based rows of the 8 boundaries per column; `fluid` (height, W):
    > 0 = fluid (NaN = none). Rule (module docstring): cumulative max over the boundaries, round
    half up, row r (0-based) gets n = #{k : r ≥ b_k − 1}, n = 8 → 0, then fluid → 8.
    """
    boundaries = np.asarray(boundaries, dtype=np.float64)
    fluid = np.asarray(fluid, dtype=np.float64)
    if boundaries.ndim != 2 or boundaries.shape[0] != N_BOUNDARIES:
        raise ValueError(f"boundaries must be (8, W), got {boundaries.shape}")
    if not np.isfinite(boundaries).all():
        raise ValueError("boundaries must be finite (crop and interpolate first)")
    if fluid.shape != (height, boundaries.shape[1]):
        raise ValueError(f"fluid must be ({height}, {boundaries.shape[1]}), got {fluid.shape}")
    first_rows = np.floor(np.maximum.accumulate(boundaries, axis=0) + 0.5) - 1.0
    rows = np.arange(height, dtype=np.float64)[:, None]
    count = np.zeros((height, boundaries.shape[1]), dtype=np.uint8)
    for first in first_rows:
        count += rows >= first[None, :]
    count[count == N_BOUNDARIES] = 0
    count[np.nan_to_num(fluid, nan=0.0) > 0] = FLUID_CLASS
    return count


def duke_files(raw_dir: Path) -> list[Path]:
    """The sorted `Subject_*.mat` files of a Duke folder (DataFormatError if there are none)."""
    raw_dir = Path(raw_dir)
    files = sorted(raw_dir.glob("Subject_*.mat")) if raw_dir.is_dir() else []
    if not files:
        raise DataFormatError(
            raw_dir, "no Subject_*.mat files found (expected Subject_01.mat … Subject_10.mat)"
        )
    return files


def load_duke_subject(path: Path, grader: int) -> list[BScan]:
    """Validate one Duke subject file and return its annotated, cropped, labelled B-scans."""
    path = Path(path)
    layers_name, fluid_name = f"manualLayers{grader}", f"manualFluid{grader}"
    data = load_mat(path, ["images", layers_name, fluid_name])
    images = _uint8_volume(path, "images", data["images"])
    layers = _numeric(path, layers_name, data[layers_name])
    fluid = _numeric(path, fluid_name, data[fluid_name])
    height, width, n_bscans = images.shape
    if layers.shape != (N_BOUNDARIES, width, n_bscans):
        raise DataFormatError(
            path,
            f"'{layers_name}' has shape {layers.shape}, expected "
            f"({N_BOUNDARIES}, {width}, {n_bscans}) to match 'images' {images.shape}",
        )
    if fluid.shape != images.shape:
        raise DataFormatError(
            path, f"'{fluid_name}' has shape {fluid.shape}, expected {images.shape} like 'images'"
        )
    annotated = np.flatnonzero(np.isfinite(layers).any(axis=(0, 1)))
    if annotated.size == 0:
        raise DataFormatError(path, f"no annotated B-scan: '{layers_name}' is NaN everywhere")
    subject = path.stem
    out = []
    for b in annotated:
        first, last, bnd = _annotated_span(path, layers_name, layers[:, :, b], int(b))
        crop_fluid = fluid[:, first : last + 1, b]
        mask = layers_to_mask(bnd, crop_fluid, height)
        out.append(BScan(subject, int(b), images[:, first : last + 1, b].copy(), mask))
    return out


def _annotated_span(
    path: Path, name: str, layers: np.ndarray, b: int
) -> tuple[int, int, np.ndarray]:
    """First and last column where all 8 boundaries are finite in B-scan `b` (8, W), and the
    boundaries of that span with interior NaN gaps filled by linear interpolation."""
    complete = np.flatnonzero(np.isfinite(layers).all(axis=0))
    if complete.size == 0:
        raise DataFormatError(
            path, f"'{name}' B-scan {b} (0-based) has no column where all 8 boundaries are set"
        )
    first, last = int(complete[0]), int(complete[-1])
    span = layers[:, first : last + 1].copy()
    cols = np.arange(span.shape[1])
    for row in span:
        known = np.isfinite(row)
        if not known.all():
            row[~known] = np.interp(cols[~known], cols[known], row[known])
    return first, last, span


@dataclass(frozen=True)
class UmnCells:
    """The paired cells of `UMNDataset.mat`: `volumes[i]` with `fluids[i]` (subject i + 1), and
    `dropped`, the 1-based `AllSubjects` cell left out for want of an annotation (or None)."""

    path: Path
    fluid_name: str
    volumes: list
    fluids: list
    dropped: int | None

    def bscans(self) -> Iterator[BScan]:
        """Validate each pair and yield every B-scan of every subject with its binary mask."""
        for i, (volume, fluid) in enumerate(zip(self.volumes, self.fluids, strict=True), start=1):
            images = _uint8_volume(self.path, f"AllSubjects{{{i}}}", volume)
            labels = _numeric(self.path, f"{self.fluid_name}{{{i}}}", fluid)
            if labels.shape != images.shape:
                raise DataFormatError(
                    self.path,
                    f"'{self.fluid_name}{{{i}}}' has shape {labels.shape}, expected "
                    f"{images.shape} like 'AllSubjects{{{i}}}'",
                )
            masks = (np.nan_to_num(labels, nan=0.0) > 0).astype(np.uint8)
            for b in range(images.shape[2]):
                yield BScan(f"Subject_{i:02d}", b, images[:, :, b].copy(), masks[:, :, b].copy())


def read_umn(raw_dir: Path, grader: int) -> UmnCells:
    """Read `UMNDataset.mat` and pair `AllSubjects` with `ManualFluid{grader}` cell by cell.

    Equal lengths pair every cell. One more `AllSubjects` cell than annotations (the release:
    30 against 29) pairs the first n in order, as public loaders of the file do, and drops the
    last, unannotated cell (module docstring); a line on stdout names the file and the cell.
    Any other difference is a DataFormatError naming both counts.
    """
    path = Path(raw_dir) / UMN_FILE
    fluid_name = f"ManualFluid{grader}"
    data = load_mat(path, ["AllSubjects", fluid_name])
    volumes, fluids = data["AllSubjects"], data[fluid_name]
    for name, value in (("AllSubjects", volumes), (fluid_name, fluids)):
        if not isinstance(value, list):
            raise DataFormatError(path, f"'{name}' must be a cell array, got {_kind(value)}")
    if len(volumes) not in (len(fluids), len(fluids) + 1):
        raise DataFormatError(
            path,
            f"cell arrays 'AllSubjects' ({len(volumes)} cells) and '{fluid_name}' "
            f"({len(fluids)} cells) have different lengths (at most one unannotated "
            "'AllSubjects' cell, the last, is allowed)",
        )
    if not fluids:
        raise DataFormatError(
            path, f"'{fluid_name}' is an empty cell array ('AllSubjects' has {len(volumes)} cells)"
        )
    dropped = len(volumes) if len(volumes) > len(fluids) else None
    if dropped is not None:
        print(
            f"[oct] {path}: 'AllSubjects' has {len(volumes)} cells, '{fluid_name}' "
            f"{len(fluids)}; dropped the unannotated last cell AllSubjects{{{dropped}}} "
            f"(Subject_{dropped:02d})",
            flush=True,
        )
    return UmnCells(path, fluid_name, volumes[: len(fluids)], fluids, dropped)


def load_bscans(raw_dir: Path, dataset: str, grader: int) -> Iterator[BScan]:
    """All labelled B-scans of `dataset` in `raw_dir`, subject by subject."""
    classes_of(dataset)
    if dataset == "duke":
        for path in duke_files(raw_dir):
            yield from load_duke_subject(path, grader)
    else:
        yield from read_umn(raw_dir, grader).bscans()


def source_files(raw_dir: Path, dataset: str) -> list[str]:
    """Names (relative to raw_dir) of the raw files `dataset` reads."""
    if dataset == "duke":
        return [path.name for path in duke_files(raw_dir)]
    classes_of(dataset)
    return [UMN_FILE]


def _kind(value: object) -> str:
    """Describe a MATLAB value for error messages."""
    if isinstance(value, list):
        return f"a cell array of {len(value)} cells"
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    return type(value).__name__


def _numeric(path: Path, name: str, value: object) -> np.ndarray:
    """`value` as a real numeric/bool numpy array, else DataFormatError naming `name`."""
    if (
        not isinstance(value, np.ndarray)
        or not (np.issubdtype(value.dtype, np.number) or value.dtype == bool)
        or np.iscomplexobj(value)
    ):
        raise DataFormatError(path, f"'{name}' must be a real numeric array, got {_kind(value)}")
    return value


def _uint8_volume(path: Path, name: str, value: object) -> np.ndarray:
    """Validate a 3-D image volume (finite, 0–255) and return it as uint8 (rounded)."""
    volume = _numeric(path, name, value)
    if volume.ndim != 3:
        raise DataFormatError(
            path, f"'{name}' must be a 3-D H×W×B volume, got shape {volume.shape}"
        )
    if 0 in volume.shape:
        raise DataFormatError(path, f"'{name}' is empty (shape {volume.shape})")
    if volume.dtype == np.uint8:
        return volume
    if not np.isfinite(volume).all():
        raise DataFormatError(path, f"'{name}' contains NaN or infinite values")
    low, high = float(volume.min()), float(volume.max())
    if low < 0 or high > 255:
        raise DataFormatError(path, f"'{name}' values span [{low}, {high}], expected 0–255")
    return np.round(volume).astype(np.uint8)


def _grader(cfg: dict, dataset: str) -> int:
    grader = cfg.get("grader", 1)
    if grader not in (1, 2):
        raise ConfigError(f"data.{dataset}.grader", f"must be 1 or 2, got {grader!r}")
    return int(grader)


def preprocess(raw_dir: Path, out_dir: Path, dataset: str, cfg: dict) -> None:
    """Read raw Duke/UMN data, resize, split by subject and write the processed format
    (module docstring) into `out_dir`. Byte-identical output for identical input and cfg."""
    classes = classes_of(dataset)
    grader = _grader(cfg, dataset)
    size = (int(cfg["size"][0]), int(cfg["size"][1]))
    umn = read_umn(Path(raw_dir), grader) if dataset == "umn" else None
    samples = umn.bscans() if umn else load_bscans(Path(raw_dir), dataset, grader)
    by_subject: dict[str, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    for sample in samples:
        image = np.clip(resize_image(sample.image, size) / np.float32(255.0), 0.0, 1.0)
        mask = resize_mask(sample.mask, size).astype(np.uint8)
        by_subject.setdefault(sample.subject, []).append((sample.bscan, image, mask))
    raw_dir = Path(raw_dir)
    splits = split_subjects(
        sorted(by_subject), cfg["split"], seed=cfg["split_seed"], key=f"data.{dataset}.split",
        source=raw_dir if dataset == "duke" else raw_dir / UMN_FILE,
        unit="subjects (Subject_*.mat files)" if dataset == "duke" else "subjects (cells)",
    )  # fmt: skip
    out_dir = Path(out_dir)
    counts: list[dict] = []
    for split in SPLITS:
        subjects = splits.get(split, [])
        rows = [(s, *item) for s in subjects for item in sorted(by_subject[s], key=lambda t: t[0])]
        masks = _stack([r[3] for r in rows], size, np.uint8)
        write_npz(
            out_dir / f"{split}.npz",
            images=_stack([r[2] for r in rows], size, np.float32),
            masks=masks,
            subjects=np.array([r[0] for r in rows], dtype=str),
            bscans=np.array([r[1] for r in rows], dtype=np.int64),
        )
        counts.append(CountRow(split, "images", len(rows)).to_dict())
        counts.append(CountRow(split, "subjects", len(subjects)).to_dict())
        for value, name in classes.items():
            present = int((masks == value).any(axis=(1, 2)).sum())
            counts.append(CountRow(split, "images_with_class", present, class_name=name).to_dict())
    write_json(
        out_dir / "meta.json",
        {
            "dataset": dataset,
            "family": FAMILY,
            "format_version": 1,
            "classes": {str(k): v for k, v in classes.items()},
            "counts": counts,
            "splits": {split: list(splits.get(split, [])) for split in SPLITS},
            "source_files": source_files(raw_dir, dataset),
            "notes": _notes(dataset, grader, size, umn.dropped if umn else None),
            "size": list(size),
            "grader": grader,
        },
    )


def _stack(arrays: list[np.ndarray], size: tuple[int, int], dtype: type) -> np.ndarray:
    """Stack 2-D arrays to (N, H, W) of `dtype`; (0, H, W) when there are none."""
    if not arrays:
        return np.zeros((0, *size), dtype=dtype)
    return np.stack(arrays).astype(dtype)


def _notes(dataset: str, grader: int, size: tuple[int, int], dropped: int | None) -> str:
    """Human-readable record of the preprocessing choices written to meta.json; `dropped` is
    the unannotated UMN `AllSubjects` cell left out (1-based), if any."""
    resize = (
        f"Images resized to {size[0]}x{size[1]} (linear, /255 to [0,1]); masks by nearest "
        "neighbour. Subject-level split."
    )
    if dataset == "duke":
        return (
            f"Grader {grader} (manualLayers{grader}, manualFluid{grader}). Annotated B-scans = "
            "B-scans with any finite boundary; each cropped to the first..last column where all "
            "8 boundaries are finite, interior gaps linearly interpolated. Mask: cumulative max "
            "over boundaries, rounded half up; row r (0-based) gets #{k: r >= b_k - 1}, 8 -> 0 "
            "(background above ILM and below RPE/choroid); fluid > 0 -> class 8 everywhere. "
            + resize
        )
    skipped = (
        f"AllSubjects cell {dropped} has no ManualFluid{grader} cell (one more than the "
        f"annotations): dropped; cells 1..{dropped - 1} paired with the annotations in order. "
        if dropped
        else ""
    )
    return (
        f"Grader {grader} (ManualFluid{grader}). Every B-scan of every subject; mask 1 = fluid "
        "(> 0), 0 = rest; subject i named Subject_{i:02d}. " + skipped + resize
    )


def overview_panels(processed_dir: Path) -> list[Panel]:
    """One panel: the image with the most foreground (mask ≠ 0) in val, else in train (the
    first val image if no image has foreground)."""
    processed_dir = Path(processed_dir)
    meta_path = processed_dir / "meta.json"
    if not meta_path.is_file():
        raise DataFormatError(meta_path, "processed meta.json not found")
    meta = json.loads(meta_path.read_text())
    class_names = {int(k): v for k, v in meta["classes"].items()}
    keys = ("images", "masks", "subjects", "bscans")
    candidates = [read_npz(processed_dir / f"{split}.npz", keys) for split in ("val", "train")]
    candidates = [arrays for arrays in candidates if len(arrays["masks"]) > 0]
    if not candidates:
        raise DataFormatError(processed_dir, "no processed images in val.npz or train.npz")
    arrays, index = candidates[0], 0
    for option in candidates:
        foreground = (option["masks"] > 0).sum(axis=(1, 2))
        if foreground.max() > 0:
            arrays, index = option, int(np.argmax(foreground))
            break
    title = f"{meta['dataset']}: {arrays['subjects'][index]}, B-scan {int(arrays['bscans'][index])}"
    return [Panel(title, arrays["images"][index], arrays["masks"][index], class_names)]


# ---------------------------------------------------------------- MATLAB files

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
