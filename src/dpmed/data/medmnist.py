"""MedMNIST (v2/v3) classification datasets: BloodMNIST, PneumoniaMNIST, DermaMNIST.

Raw format (the official download, read directly — the `medmnist` package asserts the official
sample counts, so synthetic or subsampled files would be rejected by it):
`{flag}.npz` for 28×28 images or `{flag}_{size}.npz` for size 64/128/224, holding exactly the keys
`train_images, train_labels, val_images, val_labels, test_images, test_labels`; images uint8
(N, H, W) for grayscale flags or (N, H, W, 3) for RGB flags with H = W = size; labels integer
(officially uint8) of shape (N, 1) or (N,) with values in [0, n_classes).

Processed format (`preprocess`, one folder per dataset; the OFFICIAL splits are kept as they are):
- `train.npz`, `val.npz`, `test.npz`, each with
  `images`: uint8 (N, H, W, C), channels-last, C = 1 (grayscale) or 3 (RGB), values 0..255
  exactly as in the raw file (no resizing, no normalisation: model code scales to [0, 1]);
  `labels`: int64 (N,), values in [0, n_classes).
- `meta.json`: dataset, family "medmnist", format_version 1, classes {"<label>": "<name>"},
  n_classes, channels, size, counts (one CountRow per split with class_name "all" and one per
  class and split, unit "images"), splits {} (MedMNIST has no subject ids), source_files
  [the npz name] and notes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dpmed.data.common import CountRow, Panel
from dpmed.data.npz import read_npz
from dpmed.data.registry import DATASET_REGISTRY, MedMNISTInfo
from dpmed.errors import ConfigError, DataFormatError
from dpmed.io import write_json, write_npz

SPLITS: tuple[str, ...] = ("train", "val", "test")
OFFICIAL_KEYS: tuple[str, ...] = tuple(f"{s}_{k}" for s in SPLITS for k in ("images", "labels"))
OFFICIAL_SIZES: tuple[int, ...] = (28, 64, 128, 224)
FORMAT_VERSION = 1


def medmnist_datasets() -> dict[str, MedMNISTInfo]:
    """Every registered MedMNIST dataset's facts (`dpmed.data.registry`), by name."""
    return {n: e.info for n, e in DATASET_REGISTRY.items() if e.family == "medmnist"}


def dataset_info(dataset: str) -> MedMNISTInfo:
    """The facts of MedMNIST dataset `dataset` (e.g. "bloodmnist"), from its registry entry."""
    datasets = medmnist_datasets()
    if dataset not in datasets:
        known = ", ".join(datasets)
        raise ConfigError("dataset", f"'{dataset}' is not a MedMNIST dataset (known: {known})")
    return datasets[dataset]


def npz_name(dataset: str, size: int) -> str:
    """Official file name: `{flag}.npz` at 28×28, else `{flag}_{size}.npz`."""
    dataset_info(dataset)
    return f"{dataset}.npz" if int(size) == 28 else f"{dataset}_{int(size)}.npz"


def load_npz(path: str | Path, dataset: str, size: int | None = None) -> dict[str, np.ndarray]:
    """Read and validate an official-layout MedMNIST npz.

    Checks: file present and a readable npz archive (truncated/corrupt → DataFormatError),
    exactly the six official keys, images uint8 (N, H, W) for grayscale or (N, H, W, 3) for RGB
    flags, N ≥ 1 in every split (xcal trains, audits and tests on all three), square, the same
    H in every split (and H = `size` when given), labels integer with shape (N, 1) or (N,), N
    equal to the images' N, values in [0, n_classes).
    Returns the six arrays: images as stored (uint8), labels as int64 (N,).
    """
    info = dataset_info(dataset)
    path = Path(path)
    if not path.is_file():
        hint = f" (size {size} expects '{npz_name(dataset, size)}')" if size is not None else ""
        raise DataFormatError(path, f"MedMNIST npz file not found{hint}")
    raw = _read_arrays(path)
    out: dict[str, np.ndarray] = {}
    sizes: set[int] = set()
    for split in SPLITS:
        images = raw[f"{split}_images"]
        _check_images(path, f"{split}_images", images, info, size)
        sizes.add(images.shape[1])
        out[f"{split}_images"] = images
        out[f"{split}_labels"] = _check_labels(path, split, raw[f"{split}_labels"], images, info)
    if len(sizes) > 1:
        raise DataFormatError(path, f"splits have different image sizes {sorted(sizes)}")
    return out


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Load every array of the npz (no pickles), checking the key set is the official one."""
    arrays = read_npz(path)
    missing = [k for k in OFFICIAL_KEYS if k not in arrays]
    unexpected = sorted(set(arrays) - set(OFFICIAL_KEYS))
    if missing or unexpected:
        raise DataFormatError(
            path,
            f"keys must be {list(OFFICIAL_KEYS)}; missing {missing}, unexpected {unexpected}",
        )
    return arrays


def _check_images(
    path: Path, key: str, images: np.ndarray, info: MedMNISTInfo, size: int | None
) -> None:
    """Validate dtype uint8, the layout implied by the flag's channels and the size."""
    if images.dtype != np.uint8:
        raise DataFormatError(path, f"{key} has dtype {images.dtype}, expected uint8")
    if info.channels == 1 and images.ndim != 3:
        raise DataFormatError(
            path, f"{key} has shape {images.shape}; {info.flag} is grayscale: expected (N, H, W)"
        )
    if info.channels == 3 and (images.ndim != 4 or images.shape[-1] != 3):
        raise DataFormatError(
            path, f"{key} has shape {images.shape}; {info.flag} is RGB: expected (N, H, W, 3)"
        )
    if images.shape[0] == 0:
        raise DataFormatError(
            path, f"{key} holds no image: the xcal study trains, audits and tests on every split"
        )
    height, width = images.shape[1:3]
    if height != width:
        raise DataFormatError(path, f"{key} images are {height}x{width}, expected square")
    if size is not None and height != int(size):
        raise DataFormatError(path, f"{key} images are {height}x{width}, expected {size}x{size}")


def _check_labels(
    path: Path, split: str, labels: np.ndarray, images: np.ndarray, info: MedMNISTInfo
) -> np.ndarray:
    """Validate labels of one split and return them as int64 (N,)."""
    key = f"{split}_labels"
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataFormatError(path, f"{key} has dtype {labels.dtype}, expected an integer type")
    if not (labels.ndim == 1 or (labels.ndim == 2 and labels.shape[1] == 1)):
        raise DataFormatError(path, f"{key} has shape {labels.shape}, expected (N, 1) or (N,)")
    if labels.shape[0] != images.shape[0]:
        raise DataFormatError(
            path, f"{key} has {labels.shape[0]} labels but {split}_images has {images.shape[0]}"
        )
    flat = labels.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= info.n_classes):
        raise DataFormatError(
            path,
            f"{key} values span [{flat.min()}, {flat.max()}], "
            f"expected [0, {info.n_classes - 1}] ({info.n_classes} classes)",
        )
    return flat


def preprocess(raw_dir: Path, out_dir: Path, dataset: str, cfg: dict) -> None:
    """Validate `raw_dir/{npz_name}` and write the processed format (module docstring) to
    `out_dir`: the official splits as channels-last uint8 images with int64 labels, and meta.json.
    """
    info = dataset_info(dataset)
    size = int(cfg["size"])
    source = npz_name(dataset, size)
    data = load_npz(Path(raw_dir) / source, dataset, size=size)
    out_dir = Path(out_dir)
    counts: list[dict] = []
    for split in SPLITS:
        images = data[f"{split}_images"]
        labels = data[f"{split}_labels"]
        if images.ndim == 3:
            images = images[..., None]
        write_npz(out_dir / f"{split}.npz", images=np.ascontiguousarray(images), labels=labels)
        counts.extend(_count_rows(split, labels, info))
    write_json(
        out_dir / "meta.json",
        {
            "dataset": dataset,
            "family": "medmnist",
            "format_version": FORMAT_VERSION,
            "classes": {str(i): name for i, name in enumerate(info.class_names)},
            "n_classes": info.n_classes,
            "channels": info.channels,
            "size": size,
            "counts": counts,
            "splits": {},
            "source_files": [source],
            "notes": (
                "Official MedMNIST train/val/test splits kept unchanged; labels are the official "
                "class indices (single-label, multi-class). MedMNIST publishes no subject/patient "
                "ids, so 'splits' is empty and splits are image-level. Images are stored "
                "channels-last uint8 as in the raw file (grayscale gets a channel axis of 1)."
            ),
        },
    )


def _count_rows(split: str, labels: np.ndarray, info: MedMNISTInfo) -> list[dict]:
    """CountRows for one split: the total, then images per class (zeros included)."""
    per_class = np.bincount(labels, minlength=info.n_classes)
    rows = [CountRow(split, "images", int(labels.size))]
    rows += [
        CountRow(split, "images", int(n), class_name=name)
        for name, n in zip(info.class_names, per_class, strict=True)
    ]
    return [row.to_dict() for row in rows]


def overview_panels(processed_dir: Path) -> list[Panel]:
    """One Panel: a mosaic of the first test image of each class (row-major, class 0 first,
    2 rows when there are more than 2 classes, 1-pixel white gaps; a class missing from the test
    split leaves its tile white). Image is float in [0, 1], (H, W) gray or (H, W, 3) RGB."""
    processed_dir = Path(processed_dir)
    meta = json.loads((processed_dir / "meta.json").read_text())
    info = dataset_info(meta["dataset"])
    test = read_npz(processed_dir / "test.npz", ("images", "labels"))
    images, labels = test["images"], test["labels"]
    size = images.shape[1]
    tiles = []
    for c in range(info.n_classes):
        hits = np.flatnonzero(labels == c)
        tile = images[hits[0]] if hits.size else np.full_like(images[0], 255)
        tiles.append(tile.astype(np.float32) / 255.0)
    rows = 1 if info.n_classes <= 2 else 2
    cols = -(-info.n_classes // rows)
    step = size + 1
    mosaic = np.ones((rows * step - 1, cols * step - 1, images.shape[-1]), dtype=np.float32)
    for c, tile in enumerate(tiles):
        r, k = divmod(c, cols)
        mosaic[r * step : r * step + size, k * step : k * step + size] = tile
    if info.channels == 1:
        mosaic = mosaic[..., 0]
    title = f"{info.title}: first test image per class (classes 0–{info.n_classes - 1})"
    names = dict(enumerate(info.class_names))
    return [Panel(title=title, image=mosaic, mask=None, class_names=names)]
