"""FeTS 2022 (brain-tumour MRI, 33 institutions): loader, preprocessing, federated partitions.

Raw format read (real download or the synthetic generator), inside `raw_dir`:

    {cfg["partitioning"]}               CSV, header Partition_ID,Subject_ID[,TrainOrVal]
    {sid}/{sid}_{t1,t1ce,t2,flair}.nii.gz   co-registered MRI, same 3D shape (240×240×155 real);
                                        `_t1gd` is accepted for `_t1ce`, `.nii` for `.nii.gz`
    {sid}/{sid}_seg.nii.gz              integer labels {0 background, 1 NCR, 2 ED, 4 ET}

`TrainOrVal`, when present, is read but not used: the local split is drawn here.

Processed format written by `preprocess` into `out_dir` (format_version 1):

    subjects/{sid}.image.npy   float16 (4, X', Y', Z'), channels [t1, t1ce, t2, flair]; each
                               channel z-scored over the brain voxels (mean 0, std 1 there,
                               statistics in float64), exactly 0 outside the brain. The brain is
                               the voxels where any modality is nonzero. Plain `.npy` so training
                               can memory-map it and read 64³ patches without loading the volume.
    subjects/{sid}.label.npy   uint8 (X', Y', Z'), values {0, 1, 2, 4} unchanged from the raw seg.
                               Both arrays are cropped to the same box: the bounding box of the
                               brain and of every nonzero label (no tumour voxel is ever cut).
    splits.csv                 columns subject_id, partition_id, split (train | val), one row per
                               subject, sorted by partition then subject id. Per institution the
                               val split has max(1, round(val_fraction·n)) subjects, drawn with
                               seed stable_seed("fets-split", partition_id, split_seed).
    meta.json                  dataset, family, format_version, classes, counts (subjects per split
                               and institution; label voxels per split counted over the cropped
                               volumes), splits, source_files, notes, modalities, normalisation,
                               crop, and per subject its partition, original shape and crop box
                               [[x0, x1], [y0, y1], [z0, z1]] (half-open, raw voxel indices).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dpmed.data.common import CountRow, Panel, scale_to_unit
from dpmed.data.nifti import read_nifti
from dpmed.data.splits import split_subjects
from dpmed.errors import DataFormatError
from dpmed.io import atomic_dir, write_csv, write_json
from dpmed.seeding import stable_seed

MODALITIES: tuple[str, ...] = ("t1", "t1ce", "t2", "flair")
ALIASES: dict[str, tuple[str, ...]] = {"t1ce": ("t1ce", "t1gd")}
LABELS: tuple[int, ...] = (0, 1, 2, 4)
CLASSES: dict[str, str] = {"0": "background", "1": "NCR", "2": "ED", "4": "ET"}
CSV_COLUMNS: tuple[str, ...] = ("Partition_ID", "Subject_ID")
SPLIT_COLUMNS: tuple[str, ...] = ("subject_id", "partition_id", "split")
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Collaborator:
    """One FeTS institution (partition) with its sorted train and val subject ids."""

    partition_id: int
    train: tuple[str, ...]
    val: tuple[str, ...]


# ---------------------------------------------------------------- raw loader


def read_partitions(
    raw_dir: Path, partitioning: str = "partitioning_2.csv"
) -> dict[int, list[str]]:
    """Read the partition CSV in `raw_dir`: partition id → subject ids in file order.

    Validates the header (Partition_ID,Subject_ID with an optional TrainOrVal), that partition
    ids are positive integers, subject ids are plain folder names listed once, and that every
    listed subject folder exists in `raw_dir`.
    """
    path = Path(raw_dir) / partitioning
    if not path.is_file():
        raise DataFormatError(path, "partition CSV is missing")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.reader(fh))
    header = tuple(c.strip() for c in rows[0]) if rows else ()
    if header not in (CSV_COLUMNS, (*CSV_COLUMNS, "TrainOrVal")):
        raise DataFormatError(
            path, f"header {list(header)} is not Partition_ID,Subject_ID[,TrainOrVal]"
        )
    parts: dict[int, list[str]] = {}
    seen: set[str] = set()
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise DataFormatError(
                path, f"line {line} has {len(row)} fields, expected {len(header)}"
            )
        pid_text, sid = row[0].strip(), row[1].strip()
        if not pid_text.isdigit() or int(pid_text) < 1:
            raise DataFormatError(
                path, f"line {line}: Partition_ID '{pid_text}' is not a positive integer"
            )
        if not sid or sid in (".", "..") or "/" in sid or "\\" in sid:
            raise DataFormatError(path, f"line {line}: Subject_ID '{sid}' is not a folder name")
        if sid in seen:
            raise DataFormatError(path, f"line {line}: Subject_ID '{sid}' is listed twice")
        if not (Path(raw_dir) / sid).is_dir():
            raise DataFormatError(path, f"line {line}: subject folder '{sid}' does not exist")
        seen.add(sid)
        parts.setdefault(int(pid_text), []).append(sid)
    if not parts:
        raise DataFormatError(path, "lists no subjects")
    return parts


def subject_files(raw_dir: Path, sid: str) -> dict[str, Path]:
    """Paths of the four modalities and the seg of subject `sid` (keys t1, t1ce, t2, flair, seg).

    Accepts `_t1gd` for `_t1ce` and `.nii` for `.nii.gz`; a missing file raises
    `DataFormatError` naming the expected `.nii.gz` path.
    """
    folder = Path(raw_dir) / sid
    files: dict[str, Path] = {}
    for key in (*MODALITIES, "seg"):
        candidates = [
            folder / f"{sid}_{name}{ext}"
            for name in ALIASES.get(key, (key,))
            for ext in (".nii.gz", ".nii")
        ]
        found = [p for p in candidates if p.is_file()]
        if not found:
            raise DataFormatError(candidates[0], f"{key} file of subject {sid} is missing")
        files[key] = found[0]
    return files


def read_subject(raw_dir: Path, sid: str) -> tuple[np.ndarray, np.ndarray, dict[str, Path]]:
    """Read and validate one subject.

    Returns (image float32 (4, X, Y, Z) in MODALITIES order, seg uint8 (X, Y, Z), the files
    read). Raises `DataFormatError` naming the file for a missing or truncated file, a non-3D
    volume, a shape differing from the t1 volume, NaN/inf in an image, or a seg with
    non-integer values or values outside {0, 1, 2, 4}.
    """
    files = subject_files(raw_dir, sid)
    volumes = []
    shape: tuple[int, ...] | None = None
    for key in MODALITIES:
        vol = _read_3d(files[key], shape, files[MODALITIES[0]])
        shape = vol.shape
        if vol.dtype.kind == "f" and not np.isfinite(vol).all():
            raise DataFormatError(
                files[key], f"{np.count_nonzero(~np.isfinite(vol))} NaN/inf voxels"
            )
        volumes.append(vol.astype(np.float32, copy=False))
    seg = _read_3d(files["seg"], shape, files[MODALITIES[0]])
    return np.stack(volumes), _check_labels(files["seg"], seg), files


def _read_3d(path: Path, shape: tuple[int, ...] | None, reference: Path) -> np.ndarray:
    """Read a NIfTI volume that must be 3D and, if `shape` is given, of that shape."""
    vol = read_nifti(path)
    if vol.ndim != 3:
        raise DataFormatError(path, f"expected a 3D volume, got shape {vol.shape}")
    if shape is not None and vol.shape != shape:
        raise DataFormatError(path, f"shape {vol.shape} differs from {shape} of {reference.name}")
    return vol


def _check_labels(path: Path, seg: np.ndarray) -> np.ndarray:
    """Validate seg values (integers in {0, 1, 2, 4}) and return them as uint8."""
    if seg.dtype.kind == "f":
        if not np.isfinite(seg).all():
            raise DataFormatError(path, "seg contains NaN/inf")
        if not np.array_equal(seg, np.round(seg)):
            bad = np.unique(seg[seg != np.round(seg)])[:5]
            raise DataFormatError(path, f"seg has non-integer values, e.g. {bad.tolist()}")
    elif seg.dtype.kind not in "iub":
        raise DataFormatError(path, f"seg dtype {seg.dtype} is not numeric")
    values = np.unique(seg)
    bad = [v for v in values.tolist() if v not in LABELS]
    if bad:
        raise DataFormatError(path, f"seg label values {bad} are outside {{0, 1, 2, 4}}")
    return seg.astype(np.uint8)


# ---------------------------------------------------------------- preprocessing


def normalise(image: np.ndarray, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Crop and z-score one subject.

    `image` (4, X, Y, Z), `seg` (X, Y, Z). Returns (float16 image, uint8 label, crop box (3, 2)
    half-open): cropped to the bounding box of the brain (any modality nonzero) and of the
    nonzero labels; each channel z-scored over the brain voxels and set to 0 outside them.
    """
    brain = (image != 0).any(axis=0)
    if not brain.any():
        raise ValueError("all modalities are zero")
    keep = brain | (seg > 0)
    box = np.array(
        [_extent(keep.any(axis=tuple(a for a in range(3) if a != ax))) for ax in range(3)]
    )
    sl = tuple(slice(int(a), int(b)) for a, b in box)
    brain_c = brain[sl]
    out = np.zeros((image.shape[0], *brain_c.shape), dtype=np.float16)
    for c in range(image.shape[0]):
        chan = image[c][sl]
        vals = chan[brain_c].astype(np.float64)
        std = vals.std()
        z = (vals - vals.mean()) / (std if std > 0 else 1.0)
        out[c][brain_c] = z.astype(np.float16)
    return out, seg[sl].copy(), box


def _extent(flags: np.ndarray) -> tuple[int, int]:
    """Half-open [first, last + 1) range of the True entries of a 1D mask."""
    idx = np.flatnonzero(flags)
    return int(idx[0]), int(idx[-1]) + 1


def preprocess(raw_dir: Path, out_dir: Path, dataset: str, cfg: dict) -> None:
    """Read the FeTS raw folder one subject at a time and write the processed format (see the
    module docstring) into `out_dir`; `subjects/` is replaced atomically, meta.json written last."""
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    parts = read_partitions(raw_dir, cfg["partitioning"])
    fractions = [1.0 - float(cfg["val_fraction"]), float(cfg["val_fraction"])]
    split_of: dict[str, str] = {}
    part_of: dict[str, int] = {}
    for pid, sids in parts.items():
        chosen = split_subjects(
            sids,
            fractions,
            seed=stable_seed("fets-split", pid, cfg["split_seed"]),
            names=("train", "val"),
            key="data.fets.val_fraction",
            source=raw_dir / cfg["partitioning"],
            unit=f"subjects of partition {pid}",
        )
        for split, members in chosen.items():
            for sid in members:
                split_of[sid], part_of[sid] = split, pid
    voxels = {split: np.zeros(len(LABELS), dtype=np.int64) for split in ("train", "val")}
    subjects: dict[str, dict] = {}
    sources = [cfg["partitioning"]]
    with atomic_dir(out_dir / "subjects") as tmp:
        for sid in sorted(split_of):
            image, seg, files = read_subject(raw_dir, sid)
            try:
                proc, label, box = normalise(image, seg)
            except ValueError as exc:
                raise DataFormatError(files["t1"].parent, str(exc)) from exc
            np.save(tmp / f"{sid}.image.npy", proc)
            np.save(tmp / f"{sid}.label.npy", label)
            voxels[split_of[sid]] += np.bincount(label.ravel(), minlength=5)[list(LABELS)]
            subjects[sid] = {
                "partition_id": part_of[sid],
                "original_shape": list(seg.shape),
                "crop_box": box.tolist(),
            }
            sources += [p.relative_to(raw_dir).as_posix() for p in files.values()]
    frame = pd.DataFrame(
        [(sid, part_of[sid], split_of[sid]) for sid in split_of], columns=list(SPLIT_COLUMNS)
    ).sort_values(["partition_id", "subject_id"], kind="stable")
    write_csv(out_dir / "splits.csv", frame)
    write_json(out_dir / "meta.json", _meta(dataset, frame, voxels, subjects, sources, cfg))


def _meta(
    dataset: str,
    frame: pd.DataFrame,
    voxels: dict[str, np.ndarray],
    subjects: dict[str, dict],
    sources: list[str],
    cfg: dict,
) -> dict:
    """meta.json content: counts per split (all and per institution) and the choices made."""
    counts = []
    for split in ("train", "val"):
        rows = frame[frame["split"] == split]
        counts.append(CountRow(split, "subjects", len(rows)))
        for pid, n in rows.groupby("partition_id").size().items():
            counts.append(CountRow(split, "subjects", int(n), institution=str(pid)))
        for value, n in zip(LABELS, voxels[split].tolist(), strict=True):
            counts.append(CountRow(split, "voxels", int(n), class_name=CLASSES[str(value)]))
    return {
        "dataset": dataset,
        "family": "fets",
        "format_version": FORMAT_VERSION,
        "classes": CLASSES,
        "counts": [c.to_dict() for c in counts],
        "splits": {
            s: sorted(frame.loc[frame["split"] == s, "subject_id"]) for s in ("train", "val")
        },
        "source_files": sources,
        "modalities": list(MODALITIES),
        "normalisation": "per subject and channel: z-score over brain voxels (any modality "
        "nonzero), float64 statistics, stored float16, 0 outside the brain",
        "crop": "bounding box of brain voxels and nonzero labels",
        "subjects": subjects,
        "notes": (
            f"Labels kept as in BraTS (0 background, 1 NCR, 2 ED, 4 ET); regions ET={{4}}, "
            f"TC={{1,4}}, WT={{1,2,4}}. Partitions from {cfg['partitioning']} (TrainOrVal "
            f"ignored). Local split per institution: val = max(1, round({cfg['val_fraction']}·n)) "
            f"subjects, seed stable_seed('fets-split', partition_id, {cfg['split_seed']}). "
            "Voxel counts are over the cropped volumes. `_t1gd` accepted as `_t1ce`."
        ),
    }


# ---------------------------------------------------------------- processed access


def read_splits(processed_dir: Path) -> pd.DataFrame:
    """Read and validate `splits.csv` (subject_id str, partition_id int, split train|val)."""
    path = Path(processed_dir) / "splits.csv"
    if not path.is_file():
        raise DataFormatError(path, "splits file is missing")
    frame = pd.read_csv(path, dtype={"subject_id": str, "split": str})
    if tuple(frame.columns) != SPLIT_COLUMNS:
        raise DataFormatError(path, f"columns {list(frame.columns)} are not {list(SPLIT_COLUMNS)}")
    if frame["partition_id"].dtype.kind not in "iu":
        raise DataFormatError(path, "partition_id is not an integer column")
    bad = sorted(set(frame["split"]) - {"train", "val"})
    if bad:
        raise DataFormatError(path, f"unknown split names {bad}")
    return frame


def collaborators(processed_dir: Path) -> list[Collaborator]:
    """One `Collaborator` per partition in splits.csv, sorted by partition id."""
    frame = read_splits(processed_dir)
    out = []
    for pid, group in frame.groupby("partition_id", sort=True):
        train = tuple(sorted(group.loc[group["split"] == "train", "subject_id"]))
        val = tuple(sorted(group.loc[group["split"] == "val", "subject_id"]))
        out.append(Collaborator(int(pid), train, val))
    return out


def load_subject(processed_dir: Path, sid: str, mmap: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Processed (image float16 (4, X, Y, Z), label uint8 (X, Y, Z)) of subject `sid`;
    memory-mapped read-only when `mmap` (patch sampling reads only the touched pages)."""
    mode = "r" if mmap else None
    paths = [Path(processed_dir) / "subjects" / f"{sid}.{kind}.npy" for kind in ("image", "label")]
    for path in paths:
        if not path.is_file():
            raise DataFormatError(path, f"processed file of subject {sid} is missing")
    image, label = (np.load(p, mmap_mode=mode, allow_pickle=False) for p in paths)
    if image.ndim != 4 or image.shape[0] != len(MODALITIES) or image.dtype != np.float16:
        raise DataFormatError(
            paths[0], f"expected float16 (4, X, Y, Z), got {image.dtype} {image.shape}"
        )
    if label.shape != image.shape[1:] or label.dtype != np.uint8:
        raise DataFormatError(
            paths[1], f"expected uint8 {image.shape[1:]}, got {label.dtype} {label.shape}"
        )
    return image, label


def patients_per_institution(processed_dir: Path) -> pd.DataFrame:
    """Subjects per institution for the Fig. 1 bar chart: partition_id, n_train, n_val, n_total."""
    rows = [(c.partition_id, len(c.train), len(c.val), len(c.train) + len(c.val))
            for c in collaborators(processed_dir)]  # fmt: skip
    return pd.DataFrame(rows, columns=["partition_id", "n_train", "n_val", "n_total"])


@dataclass(frozen=True)
class AxialSlice:
    """One axial slice (along Z) of a processed subject, rotated so anterior is up.

    Args:
        subject: the subject id.
        z: the slice index in the cropped volume.
        images: float32 (4, H, W) in [0, 1], channels `MODALITIES`, each rescaled by its own
            1st/99th percentiles over the slice's brain voxels, 0 outside the brain.
        label: (H, W) BraTS labels 0/1/2/4.
    """

    subject: str
    z: int
    images: np.ndarray
    label: np.ndarray


def tumour_slice(processed_dir: Path) -> AxialSlice:
    """The axial slice with most tumour voxels of the first val subject (sorted id) that has
    tumour (else the middle slice of the first val subject): the sample of the data overview
    and of paper 000 Fig. 2."""
    frame = read_splits(processed_dir)
    val_ids = sorted(frame.loc[frame["split"] == "val", "subject_id"])
    if not val_ids:
        raise DataFormatError(Path(processed_dir) / "splits.csv", "no val subjects")
    chosen, z = val_ids[0], None
    for sid in val_ids:
        _, label = load_subject(processed_dir, sid)
        per_slice = np.count_nonzero(label, axis=(0, 1))
        if per_slice.any():
            chosen, z = sid, int(np.argmax(per_slice))
            break
    image, label = load_subject(processed_dir, chosen)
    z = image.shape[3] // 2 if z is None else z
    brain = (np.asarray(image[:, :, :, z]) != 0).any(axis=0)
    shown = []
    for channel in np.asarray(image[:, :, :, z], dtype=np.float32):
        low, high = np.percentile(channel[brain], [1, 99]) if brain.any() else (0.0, 1.0)
        if high <= low:
            high = low + 1.0
        shown.append(np.rot90(np.where(brain, scale_to_unit(channel, low, high), 0.0)))
    images = np.stack(shown).astype(np.float32)
    return AxialSlice(chosen, z, images, np.rot90(np.asarray(label[:, :, z])).copy())


def overview_panels(processed_dir: Path) -> list[Panel]:
    """One panel: the FLAIR image of `tumour_slice` with its 0/1/2/4 mask."""
    view = tumour_slice(processed_dir)
    flair = view.images[MODALITIES.index("flair")]
    return [Panel(f"FeTS 2022 {view.subject} FLAIR z={view.z}", flair, view.label,
                  {1: "NCR", 2: "ED", 4: "ET"})]  # fmt: skip
