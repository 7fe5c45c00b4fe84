"""COVID-19 CT (MedSeg / SIRM, as used by Inf-Net): loaders, preprocessing, overview panel.

Raw layouts read from any folder (the synthetic generator writes the first):
- MedSeg: `tr_im.nii.gz` (H×W×N axial slices in Hounsfield units, nibabel axis order) and
  `tr_mask.nii.gz` (H×W×N labels 0 background, 1 ground-glass, 2 consolidation,
  3 pleural effusion; stored as float or integer).
- Inf-Net: `Imgs/<stem>.jpg|.png` (grayscale or RGB CT slices, 8 bit) and `GT/<stem>.png`
  (binary infection masks, values 0/255 or 0/1); `Edge/` is ignored.

Processed format (`out_dir`), the 2D-segmentation format shared with the OCT family:
- `{train,val,test}.npz` (uncompressed), per split with N slices of size `cfg["size"]` (H, W):
  - `images`   float32 (N, H, W) in [0, 1]. MedSeg: HU mapped linearly with the lung window
    [−1250, 250] HU (−1250 → 0, 250 → 1, clipped outside). Inf-Net: gray value / 255 (RGB is
    converted to luma first). Resized with linear interpolation.
  - `masks`    uint8 (N, H, W) in {0, 1}: 1 = infection. MedSeg: labels {1, 2} (ground-glass +
    consolidation) → 1, labels {0, 3} (background, pleural effusion) → 0. Inf-Net: GT > 0 → 1.
    Resized by nearest neighbour.
  - `subjects` str (N,): slice id ("slice_000" … for MedSeg, the file stem for Inf-Net).
  - `bscans`   int64 (N,): slice index in the raw volume (MedSeg) or in the sorted stems (Inf-Net).
  Slices are ordered by slice id within each split.
- `meta.json`: dataset, family, format_version 1, classes {"0": background, "1": infection},
  counts (CountRow dicts), splits (split → slice ids), source_files, notes, plus `layout`,
  `size` and (MedSeg) `hu_window`.

MedSeg has no patient ids, so the split is slice-level (seeded by `cfg["split_seed"]`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from dpmed.data.common import CountRow, Panel, resize_image, resize_mask, scale_to_unit
from dpmed.data.nifti import read_nifti
from dpmed.data.npz import read_npz
from dpmed.data.splits import split_subjects
from dpmed.errors import DataFormatError
from dpmed.io import write_json, write_npz

FAMILY = "covid_ct"
FORMAT_VERSION = 1
IMAGE_FILE = "tr_im.nii.gz"
MASK_FILE = "tr_mask.nii.gz"
LABEL_NAMES = {0: "background", 1: "ground-glass", 2: "consolidation", 3: "pleural effusion"}
INFECTION_LABELS = (1, 2)
HU_WINDOW = (-1250.0, 250.0)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
PIL_MODES = ("1", "L", "P", "RGB", "RGBA", "LA")
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class RawSlices:
    """Slices read from either raw layout, before resizing.

    `images[i]` float32 (H_i, W_i) in [0, 1]; `masks[i]` uint8 (H_i, W_i) binary infection;
    `label_voxels` int64 (N, 4) voxels of each MedSeg label per slice (None for Inf-Net);
    `source_files` names relative to the raw folder.
    """

    layout: str
    ids: list[str]
    indices: list[int]
    images: list[np.ndarray]
    masks: list[np.ndarray]
    label_voxels: np.ndarray | None
    source_files: list[str]


def detect_layout(raw_dir: Path) -> str:
    """Return the raw layout: "medseg" (tr_im/tr_mask present) or "infnet" (Imgs/ present)."""
    raw_dir = Path(raw_dir)
    if (raw_dir / IMAGE_FILE).exists() or (raw_dir / MASK_FILE).exists():
        return "medseg"
    if (raw_dir / "Imgs").is_dir():
        return "infnet"
    raise DataFormatError(
        raw_dir, f"neither {IMAGE_FILE} + {MASK_FILE} (MedSeg) nor Imgs/ + GT/ (Inf-Net) found"
    )


def load_medseg(raw_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate the MedSeg pair. Returns (hu float32 H×W×N, labels uint8 H×W×N).

    Raises DataFormatError for a missing or truncated file, a non-3-D volume, a shape mismatch,
    non-finite HU values, or mask values outside {0, 1, 2, 3} (the bad values are named).
    """
    raw_dir = Path(raw_dir)
    image_path, mask_path = raw_dir / IMAGE_FILE, raw_dir / MASK_FILE
    for path in (image_path, mask_path):
        if not path.is_file():
            raise DataFormatError(path, "file is missing (MedSeg layout needs tr_im + tr_mask)")
    hu = read_nifti(image_path, dtype=np.float32)
    labels = read_nifti(mask_path)
    for path, volume in ((image_path, hu), (mask_path, labels)):
        if volume.ndim != 3:
            raise DataFormatError(path, f"expected a 3-D H×W×N volume, got shape {volume.shape}")
    if hu.shape != labels.shape:
        raise DataFormatError(
            mask_path, f"shape {labels.shape} differs from {IMAGE_FILE} shape {hu.shape}"
        )
    if not np.isfinite(hu).all():
        raise DataFormatError(image_path, "contains NaN or infinite values")
    return hu, _validate_labels(mask_path, labels)


def _validate_labels(path: Path, labels: np.ndarray) -> np.ndarray:
    """Check mask values ⊂ {0, 1, 2, 3} (integral, finite) and return them as uint8."""
    allowed = np.zeros(labels.shape, dtype=bool)
    for value in LABEL_NAMES:
        allowed |= labels == value
    if not allowed.all():
        bad = np.unique(labels[~allowed])
        shown = ", ".join(f"{v:g}" for v in bad[:10].tolist())
        raise DataFormatError(
            path, f"mask values must be in {{0, 1, 2, 3}}; found {shown} ({bad.size} bad values)"
        )
    return labels.astype(np.uint8)


def binary_infection(labels: np.ndarray) -> np.ndarray:
    """MedSeg labels → binary infection mask uint8: {1, 2} → 1, {0, 3} → 0."""
    return np.isin(labels, INFECTION_LABELS).astype(np.uint8)


def hu_to_unit(hu: np.ndarray) -> np.ndarray:
    """Lung window: HU −1250 → 0, 250 → 1, linear between, clipped outside (float32)."""
    return scale_to_unit(hu, *HU_WINDOW)


def load_infnet(raw_dir: Path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Read and validate the Inf-Net layout: `Imgs/<stem>.jpg|.png` + `GT/<stem>.png`.

    Returns (stem, gray image float32 in [0, 1], binary mask uint8) sorted by stem. Raises
    DataFormatError for a missing folder, an image without GT or GT without image, duplicate
    stems, unreadable files, size mismatch, or GT values other than {0, 255} / {0, 1}.
    """
    raw_dir = Path(raw_dir)
    images = _files_by_stem(raw_dir / "Imgs", IMAGE_SUFFIXES)
    truths = _files_by_stem(raw_dir / "GT", (".png",))
    if not images:
        raise DataFormatError(raw_dir / "Imgs", "no .jpg/.png images found")
    for stem, path in images.items():
        if stem not in truths:
            raise DataFormatError(path, f"no matching ground truth GT/{stem}.png")
    for stem, path in truths.items():
        if stem not in images:
            raise DataFormatError(path, f"no matching image Imgs/{stem}.jpg or .png")
    out = []
    for stem in sorted(images):
        gray = _read_gray(images[stem])
        truth = _read_gray(truths[stem])
        if truth.shape != gray.shape:
            raise DataFormatError(
                truths[stem],
                f"size {truth.shape} differs from image {images[stem].name} size {gray.shape}",
            )
        out.append(
            (
                stem,
                (gray / np.float32(255.0)).astype(np.float32),
                _binary_truth(truths[stem], truth),
            )
        )
    return out


def _files_by_stem(folder: Path, suffixes: tuple[str, ...]) -> dict[str, Path]:
    """Map stem → file for the files in `folder` with one of `suffixes` (case-insensitive)."""
    if not folder.is_dir():
        raise DataFormatError(folder, "folder is missing (Inf-Net layout needs Imgs/ and GT/)")
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix.lower() not in suffixes:
            continue
        if path.stem in found:
            raise DataFormatError(path, f"duplicate stem '{path.stem}' (also {found[path.stem]})")
        found[path.stem] = path
    return found


def _read_gray(path: Path) -> np.ndarray:
    """Read an 8-bit image as a (H, W) uint8 gray array (RGB → luma), naming `path` on error."""
    try:
        with Image.open(path) as image:
            image.load()
            mode = image.mode
            gray = np.asarray(image.convert("L"), dtype=np.uint8) if mode in PIL_MODES else None
    except (OSError, SyntaxError, ValueError) as exc:
        raise DataFormatError(path, f"cannot read image (truncated or corrupt?): {exc}") from exc
    if gray is None:
        raise DataFormatError(path, f"unsupported image mode {mode} (expected 8-bit gray/RGB)")
    return gray


def _binary_truth(path: Path, truth: np.ndarray) -> np.ndarray:
    """GT values {0, 255} or {0, 1} → binary uint8; other values raise naming them."""
    values = set(np.unique(truth).tolist())
    if not (values <= {0, 255} or values <= {0, 1}):
        bad = sorted(values - {0, 1, 255}) or sorted(values)
        raise DataFormatError(
            path, f"ground-truth values must be {{0, 255}} or {{0, 1}}; found {bad[:10]}"
        )
    return (truth > 0).astype(np.uint8)


def read_raw(raw_dir: Path) -> RawSlices:
    """Read either raw layout into per-slice unit-range images and binary infection masks."""
    raw_dir = Path(raw_dir)
    if detect_layout(raw_dir) == "medseg":
        hu, labels = load_medseg(raw_dir)
        n = hu.shape[2]
        width = max(3, len(str(n - 1)))
        counts = np.stack(
            [(labels == value).sum(axis=(0, 1)) for value in LABEL_NAMES], axis=1
        ).astype(np.int64)
        return RawSlices(
            layout="medseg",
            ids=[f"slice_{k:0{width}d}" for k in range(n)],
            indices=list(range(n)),
            images=[hu_to_unit(hu[:, :, k]) for k in range(n)],
            masks=[binary_infection(labels[:, :, k]) for k in range(n)],
            label_voxels=counts,
            source_files=[IMAGE_FILE, MASK_FILE],
        )
    slices = load_infnet(raw_dir)
    sources = sorted(
        str(path.relative_to(raw_dir))
        for folder, suffixes in (("Imgs", IMAGE_SUFFIXES), ("GT", (".png",)))
        for path in _files_by_stem(raw_dir / folder, suffixes).values()
    )
    return RawSlices(
        layout="infnet",
        ids=[stem for stem, _, _ in slices],
        indices=list(range(len(slices))),
        images=[image for _, image, _ in slices],
        masks=[mask for _, _, mask in slices],
        label_voxels=None,
        source_files=sources,
    )


def preprocess(raw_dir: Path, out_dir: Path, dataset: str, cfg: dict) -> None:
    """Read the raw folder, resize to `cfg["size"]`, split slice-level by `cfg["split"]` /
    `cfg["split_seed"]`, and write `{train,val,test}.npz` + `meta.json` into `out_dir`."""
    raw_dir = Path(raw_dir)
    raw = read_raw(raw_dir)
    out_dir = Path(out_dir)
    size = (int(cfg["size"][0]), int(cfg["size"][1]))
    medseg = raw.layout == "medseg"
    splits = split_subjects(
        raw.ids, cfg["split"], seed=int(cfg["split_seed"]), key=f"data.{dataset}.split",
        source=raw_dir / (IMAGE_FILE if medseg else "Imgs"), unit="slices" if medseg else "images",
    )  # fmt: skip
    position = {slice_id: i for i, slice_id in enumerate(raw.ids)}
    counts: list[dict] = []
    for split in SPLITS:
        members = [position[slice_id] for slice_id in splits[split]]
        images = np.zeros((len(members), *size), dtype=np.float32)
        masks = np.zeros((len(members), *size), dtype=np.uint8)
        for row, i in enumerate(members):
            images[row] = np.clip(resize_image(raw.images[i], size), 0.0, 1.0)
            masks[row] = resize_mask(raw.masks[i], size)
        write_npz(
            out_dir / f"{split}.npz",
            images=images,
            masks=masks,
            subjects=np.array(splits[split], dtype=str).reshape(len(members)),
            bscans=np.array([raw.indices[i] for i in members], dtype=np.int64),
        )
        counts.extend(row.to_dict() for row in _count_rows(raw, split, members))
    write_json(out_dir / "meta.json", _meta(raw, dataset, size, splits, counts))


def _count_rows(raw: RawSlices, split: str, members: list[int]) -> list[CountRow]:
    """Images and images with infection (raw resolution) per split; MedSeg voxels per label."""
    with_infection = sum(int(raw.masks[i].any()) for i in members)
    rows = [
        CountRow(split, "images", len(members)),
        CountRow(split, "images_with_class", with_infection, class_name="infection"),
    ]
    if raw.label_voxels is not None:
        for value in (1, 2, 3):
            voxels = int(raw.label_voxels[members, value].sum())
            rows.append(CountRow(split, "voxels", voxels, class_name=LABEL_NAMES[value]))
    return rows


def _meta(
    raw: RawSlices, dataset: str, size: tuple[int, int], splits: dict, counts: list[dict]
) -> dict:
    """The `meta.json` content (see the module docstring)."""
    notes = [
        "Binary task: 1 = infection.",
        "Split is slice-level: the MedSeg release has no patient ids"
        if raw.layout == "medseg"
        else "Split is slice-level over image stems (no patient ids in the Inf-Net layout)",
        "images_with_class and voxels are counted on the raw (unresized) masks.",
    ]
    meta = {
        "dataset": dataset,
        "family": FAMILY,
        "format_version": FORMAT_VERSION,
        "layout": raw.layout,
        "size": list(size),
        "classes": {"0": "background", "1": "infection"},
        "counts": counts,
        "splits": {split: list(splits[split]) for split in SPLITS},
        "source_files": raw.source_files,
    }
    if raw.layout == "medseg":
        notes[0] += (
            " MedSeg labels 1 ground-glass and 2 consolidation -> 1; 0 background and"
            " 3 pleural effusion -> 0 (effusion is not lung infection, as in Inf-Net)."
            " Images: HU lung window [-1250, 250] -> [0, 1], clipped."
        )
        meta["hu_window"] = list(HU_WINDOW)
        meta["original_labels"] = {str(k): v for k, v in LABEL_NAMES.items()}
    else:
        notes[0] += " Inf-Net GT > 0 -> 1. Images: gray / 255 (RGB converted to luma)."
    meta["notes"] = " ".join(notes)
    return meta


def overview_panels(processed_dir: Path) -> list[Panel]:
    """One panel: the val (else train) slice with the most infection pixels, with its mask.

    Ties go to the first slice in split order; if no slice has infection, the first val slice
    (else train) is shown."""
    processed_dir = Path(processed_dir)
    meta = json.loads((processed_dir / "meta.json").read_text())
    candidates = []
    for split in ("val", "train"):
        data = read_npz(processed_dir / f"{split}.npz", ("images", "masks", "subjects"))
        if len(data["masks"]):
            candidates.append((split, data["images"], data["masks"], data["subjects"]))
    if not candidates:
        raise DataFormatError(processed_dir, "val.npz and train.npz hold no slices")
    chosen = next((c for c in candidates if c[2].any()), candidates[0])
    split, images, masks, subjects = chosen
    index = int(np.argmax(masks.reshape(len(masks), -1).sum(axis=1)))
    return [
        Panel(
            title=f"{meta['dataset']} ({split} {subjects[index]})",
            image=images[index],
            mask=masks[index],
            class_names={1: "infection"},
        )
    ]
