"""MedMNIST family: synthetic generator, validating npz loader, preprocess and overview panel."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dpmed.data import medmnist
from dpmed.data.medmnist import dataset_info, load_npz, medmnist_datasets, npz_name, preprocess
from dpmed.data.synthetic.medmnist import class_counts, generate
from dpmed.errors import ConfigError, DataFormatError

DATASETS = medmnist_datasets()
FLAGS = tuple(DATASETS)
KEYS = (
    "train_images",
    "train_labels",
    "val_images",
    "val_labels",
    "test_images",
    "test_labels",
)


def _cfg(size: int = 28, counts: tuple[int, int, int] = (40, 10, 16)) -> dict:
    return {"raw": "synthetic", "size": size, "synthetic": {"counts": list(counts)}}


def _official(dataset: str, n: tuple[int, int, int] = (5, 3, 4), size: int = 6) -> dict:
    """A small official-layout dict written independently of the generator."""
    info = dataset_info(dataset)
    rng = np.random.default_rng(0)
    shape = (size, size) if info.channels == 1 else (size, size, 3)
    out = {}
    for split, count in zip(("train", "val", "test"), n, strict=True):
        out[f"{split}_images"] = rng.integers(0, 256, (count, *shape), dtype=np.uint8)
        out[f"{split}_labels"] = (np.arange(count) % info.n_classes).astype(np.uint8)[:, None]
    return out


def _write(path: Path, arrays: dict) -> Path:
    np.savez(path, **arrays)
    return path


# --- facts -------------------------------------------------------------------------------


def test_dataset_table_matches_official_facts() -> None:
    blood, pneu, derma = (DATASETS[f] for f in FLAGS)
    assert (blood.n_classes, blood.channels, blood.split_sizes) == (8, 3, (11959, 1712, 3421))
    assert (pneu.n_classes, pneu.channels, pneu.split_sizes) == (2, 1, (4708, 524, 624))
    assert (derma.n_classes, derma.channels, derma.split_sizes) == (7, 3, (7007, 1003, 2005))
    for info in (blood, pneu, derma):
        assert sum(info.train_class_counts) == info.split_sizes[0]
    assert derma.class_names[4] == "melanoma"
    assert derma.train_class_counts[5] / 7007 == pytest.approx(0.67, abs=0.005)


def test_file_name_convention() -> None:
    assert npz_name("bloodmnist", 28) == "bloodmnist.npz"
    assert npz_name("bloodmnist", 64) == "bloodmnist_64.npz"
    assert npz_name("dermamnist", 224) == "dermamnist_224.npz"


# --- generator ---------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", FLAGS)
def test_generator_writes_official_layout(tmp_path: Path, dataset: str) -> None:
    info = dataset_info(dataset)
    generate(tmp_path / "raw", dataset, _cfg(), seed=3)
    path = tmp_path / "raw" / f"{dataset}.npz"
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == [f"{dataset}.npz"]
    with np.load(path) as npz:
        assert sorted(npz.files) == sorted(KEYS)
        for split, count in zip(("train", "val", "test"), (40, 10, 16), strict=True):
            images, labels = npz[f"{split}_images"], npz[f"{split}_labels"]
            shape = (count, 28, 28) if info.channels == 1 else (count, 28, 28, 3)
            assert images.dtype == np.uint8 and images.shape == shape
            assert labels.dtype == np.uint8 and labels.shape == (count, 1)
            assert set(np.unique(labels)) == set(range(info.n_classes))
    data = load_npz(path, dataset, size=28)
    assert data["train_labels"].dtype == np.int64 and data["train_labels"].shape == (40,)


def test_generator_size_64_name_and_determinism(tmp_path: Path) -> None:
    generate(tmp_path / "a", "pneumoniamnist", _cfg(64, (12, 4, 4)), seed=5)
    generate(tmp_path / "b", "pneumoniamnist", _cfg(64, (12, 4, 4)), seed=5)
    generate(tmp_path / "c", "pneumoniamnist", _cfg(64, (12, 4, 4)), seed=6)
    name = "pneumoniamnist_64.npz"
    assert [p.name for p in (tmp_path / "a").iterdir()] == [name]
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    assert load_npz(tmp_path / "a" / name, "pneumoniamnist", 64)["val_images"].shape == (4, 64, 64)


@pytest.mark.parametrize("dataset", FLAGS)
def test_class_proportions_follow_official_train(tmp_path: Path, dataset: str) -> None:
    info = dataset_info(dataset)
    official = np.asarray(info.train_class_counts) / sum(info.train_class_counts)
    generate(tmp_path, dataset, _cfg(counts=(3000, 8, 8)), seed=1)
    with np.load(tmp_path / f"{dataset}.npz") as npz:
        train = npz["train_labels"][:, 0]
        val = npz["val_labels"][:, 0]
    freq = np.bincount(train, minlength=info.n_classes) / train.size
    np.testing.assert_allclose(freq, official, atol=0.003)
    assert np.bincount(val, minlength=info.n_classes).min() >= 1  # 8 images ≥ n_classes


def test_class_counts_small_split_keeps_every_class() -> None:
    info = dataset_info("dermamnist")
    counts = class_counts(info, 10)
    assert counts.sum() == 10 and counts.min() >= 1
    assert counts[5] == counts.max()  # nevi dominate
    assert class_counts(info, 3).sum() == 3


# SHA-256 of the train, val and test labels (in that order) the generator wrote for
# `_cfg(counts=(240, 40, 120))`, seed 3, before `class_balance` existed.
OFFICIAL_LABEL_SHA256 = {
    "bloodmnist": "dbf172c506022f3bedd5acde2208ffb30bcbf427337962871ea7869fd6551378",
    "pneumoniamnist": "4dc5981bb802d99ff8b1063dbb8257740f343ca9aa0c689d93e1121aa69dcc8a",
    "dermamnist": "5b70b1510a5fdc4ba2cc7bdb50ea1d5c3b2fd509ef7f4afa041e43a82cf67b8d",
}


def _balanced_cfg(balance: str, counts: tuple[int, int, int] = (240, 40, 120)) -> dict:
    cfg = _cfg(counts=counts)
    cfg["synthetic"]["class_balance"] = balance
    return cfg


def _labels(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {split: npz[f"{split}_labels"][:, 0] for split in ("train", "val", "test")}


@pytest.mark.parametrize("dataset", FLAGS)
def test_default_class_balance_is_official_and_unchanged(tmp_path: Path, dataset: str) -> None:
    generate(tmp_path / "default", dataset, _cfg(counts=(240, 40, 120)), seed=3)
    generate(tmp_path / "official", dataset, _balanced_cfg("official"), seed=3)
    default = (tmp_path / "default" / f"{dataset}.npz").read_bytes()
    assert default == (tmp_path / "official" / f"{dataset}.npz").read_bytes()
    labels = _labels(tmp_path / "default" / f"{dataset}.npz")
    digest = hashlib.sha256(b"".join(labels[s].tobytes() for s in ("train", "val", "test")))
    assert digest.hexdigest() == OFFICIAL_LABEL_SHA256[dataset]


@pytest.mark.parametrize("dataset", FLAGS)
def test_uniform_class_balance_counts_differ_by_at_most_one(tmp_path: Path, dataset: str) -> None:
    info = dataset_info(dataset)
    counts = (241, 39, 120)
    generate(tmp_path / "a", dataset, _balanced_cfg("uniform", counts), seed=3)
    generate(tmp_path / "b", dataset, _balanced_cfg("uniform", counts), seed=3)
    generate(tmp_path / "c", dataset, _balanced_cfg("uniform", counts), seed=4)
    name = f"{dataset}.npz"
    for (split, labels), n in zip(_labels(tmp_path / "a" / name).items(), counts, strict=True):
        per_class = np.bincount(labels, minlength=info.n_classes)
        assert per_class.sum() == n and per_class.max() - per_class.min() <= 1, split
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()


def test_class_counts_uniform_and_unknown_balance(tmp_path: Path) -> None:
    info = dataset_info("dermamnist")
    np.testing.assert_array_equal(class_counts(info, 23, "uniform"), [4, 4, 3, 3, 3, 3, 3])
    np.testing.assert_array_equal(class_counts(info, 5, "uniform"), [1, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(class_counts(info, 10), class_counts(info, 10, "official"))
    with pytest.raises(ConfigError, match="class_balance"):
        generate(tmp_path, "dermamnist", _balanced_cfg("balanced"), seed=0)


@pytest.mark.parametrize("dataset", FLAGS)
def test_synthetic_classes_are_learnable_by_nearest_class_mean(
    tmp_path: Path, dataset: str
) -> None:
    """Independent check that the label carries image signal: a nearest-class-mean classifier
    on raw pixels reaches balanced accuracy > 1.5 × chance on the test split."""
    info = dataset_info(dataset)
    generate(tmp_path, dataset, _cfg(28, (2000, 10, 600)), seed=11)
    with np.load(tmp_path / f"{dataset}.npz") as npz:
        x = npz["train_images"].reshape(2000, -1) / 255.0
        y = npz["train_labels"][:, 0]
        xt = npz["test_images"].reshape(600, -1) / 255.0
        yt = npz["test_labels"][:, 0]
    means = np.stack([x[y == c].mean(axis=0) for c in range(info.n_classes)])
    dist = (xt**2).sum(1)[:, None] - 2 * xt @ means.T + (means**2).sum(1)[None, :]
    pred = dist.argmin(axis=1)
    balanced = np.mean([(pred[yt == c] == c).mean() for c in range(info.n_classes)])
    assert balanced > 1.5 / info.n_classes


# --- loader ------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", FLAGS)
def test_loader_reads_independently_written_npz(tmp_path: Path, dataset: str) -> None:
    arrays = _official(dataset)
    path = _write(tmp_path / f"{dataset}.npz", arrays)
    data = load_npz(path, dataset, size=6)
    for key in KEYS:
        if key.endswith("images"):
            np.testing.assert_array_equal(data[key], arrays[key])
        else:
            np.testing.assert_array_equal(data[key], arrays[key][:, 0].astype(np.int64))


def test_loader_accepts_flat_int64_labels(tmp_path: Path) -> None:
    arrays = _official("bloodmnist")
    arrays["train_labels"] = arrays["train_labels"][:, 0].astype(np.int64)
    data = load_npz(_write(tmp_path / "b.npz", arrays), "bloodmnist")
    np.testing.assert_array_equal(data["train_labels"], [0, 1, 2, 3, 4])


def _bad_cases() -> dict[str, tuple[str, Callable[[dict], None], str]]:
    def drop_key(a: dict) -> None:
        del a["val_labels"]

    def extra_key(a: dict) -> None:
        a["train_masks"] = a["train_labels"]

    def float_images(a: dict) -> None:
        a["train_images"] = a["train_images"].astype(np.float32)

    def rgb_for_gray(a: dict) -> None:
        a["test_images"] = np.repeat(a["test_images"][..., None], 3, axis=-1)

    def gray_for_rgb(a: dict) -> None:
        a["test_images"] = a["test_images"][..., 0]

    def label_too_large(a: dict) -> None:
        a["val_labels"] = a["val_labels"].copy()
        a["val_labels"][0, 0] = 8

    def negative_label(a: dict) -> None:
        a["val_labels"] = a["val_labels"].astype(np.int8) - 1

    def float_labels(a: dict) -> None:
        a["train_labels"] = a["train_labels"].astype(np.float32)

    def count_mismatch(a: dict) -> None:
        a["train_labels"] = a["train_labels"][:-1]

    def labels_2d(a: dict) -> None:
        a["train_labels"] = np.repeat(a["train_labels"], 2, axis=1)

    def not_square(a: dict) -> None:
        a["train_images"] = a["train_images"][:, :, :5]

    return {
        "missing key": ("bloodmnist", drop_key, "missing ['val_labels']"),
        "unexpected key": ("bloodmnist", extra_key, "unexpected ['train_masks']"),
        "float images": ("bloodmnist", float_images, "dtype float32, expected uint8"),
        "rgb for pneumonia": ("pneumoniamnist", rgb_for_gray, "grayscale"),
        "gray for blood": ("bloodmnist", gray_for_rgb, "is RGB"),
        "label >= n_classes": ("bloodmnist", label_too_large, "span [1, 8]"),
        "negative label": ("bloodmnist", negative_label, "span [-1, 1]"),
        "float labels": ("dermamnist", float_labels, "integer type"),
        "count mismatch": ("dermamnist", count_mismatch, "4 labels but"),
        "labels (N, 2)": ("dermamnist", labels_2d, "shape (5, 2)"),
        "not square": ("pneumoniamnist", not_square, "square"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_loader_rejects_bad_input(tmp_path: Path, case: str) -> None:
    dataset, corrupt, problem = _bad_cases()[case]
    arrays = _official(dataset)
    corrupt(arrays)
    path = _write(tmp_path / f"{dataset}.npz", arrays)
    with pytest.raises(DataFormatError) as err:
        load_npz(path, dataset)
    assert str(path) in str(err.value) and problem in err.value.problem


def test_loader_rejects_missing_wrong_size_and_truncated(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="not found"):
        load_npz(tmp_path / "bloodmnist.npz", "bloodmnist")
    path = _write(tmp_path / "bloodmnist.npz", _official("bloodmnist"))
    with pytest.raises(DataFormatError, match="expected 28x28") as err:
        load_npz(path, "bloodmnist", size=28)
    assert str(path) in str(err.value)
    data = path.read_bytes()
    for cut in (len(data) - 10, len(data) // 2, 30):
        bad = tmp_path / f"cut{cut}.npz"
        bad.write_bytes(data[:cut])
        with pytest.raises(DataFormatError, match="truncated or corrupt") as err:
            load_npz(bad, "bloodmnist")
        assert str(bad) in str(err.value)
    npy = tmp_path / "single.npz"
    with open(npy, "wb") as fh:
        np.save(fh, np.zeros(3))
    with pytest.raises(DataFormatError, match="not an npz"):
        load_npz(npy, "bloodmnist")


# --- preprocess --------------------------------------------------------------------------


def test_preprocess_independent_gray_file_hand_checked(tmp_path: Path) -> None:
    arrays = _official("pneumoniamnist", n=(5, 3, 4), size=28)
    (tmp_path / "raw").mkdir()
    _write(tmp_path / "raw" / "pneumoniamnist.npz", arrays)
    out = tmp_path / "out"
    preprocess(tmp_path / "raw", out, "pneumoniamnist", _cfg())
    with np.load(out / "train.npz") as npz:
        assert npz["images"].dtype == np.uint8 and npz["images"].shape == (5, 28, 28, 1)
        np.testing.assert_array_equal(npz["images"][..., 0], arrays["train_images"])
        assert npz["labels"].dtype == np.int64
        np.testing.assert_array_equal(npz["labels"], [0, 1, 0, 1, 0])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dataset"] == "pneumoniamnist" and meta["family"] == "medmnist"
    assert meta["format_version"] == 1 and meta["splits"] == {}
    assert meta["classes"] == {"0": "normal", "1": "pneumonia"}
    assert (meta["n_classes"], meta["channels"], meta["size"]) == (2, 1, 28)
    assert meta["source_files"] == ["pneumoniamnist.npz"]
    rows = {(r["split"], r["class_name"]): r["count"] for r in meta["counts"]}
    assert rows == {
        ("train", "all"): 5,
        ("train", "normal"): 3,
        ("train", "pneumonia"): 2,
        ("val", "all"): 3,
        ("val", "normal"): 2,
        ("val", "pneumonia"): 1,
        ("test", "all"): 4,
        ("test", "normal"): 2,
        ("test", "pneumonia"): 2,
    }
    assert {r["unit"] for r in meta["counts"]} == {"images"}


def test_preprocess_rgb_keeps_channels_and_requires_sized_file(tmp_path: Path) -> None:
    generate(tmp_path / "raw", "dermamnist", _cfg(), seed=2)
    with pytest.raises(DataFormatError, match="dermamnist_64.npz"):
        preprocess(tmp_path / "raw", tmp_path / "out", "dermamnist", _cfg(size=64))
    preprocess(tmp_path / "raw", tmp_path / "out", "dermamnist", _cfg())
    raw = load_npz(tmp_path / "raw" / "dermamnist.npz", "dermamnist")
    with np.load(tmp_path / "out" / "test.npz") as npz:
        np.testing.assert_array_equal(npz["images"], raw["test_images"])
        np.testing.assert_array_equal(npz["labels"], raw["test_labels"])


@pytest.mark.parametrize("dataset", FLAGS)
def test_preprocess_twice_is_byte_identical(tmp_path: Path, dataset: str) -> None:
    generate(tmp_path / "raw", dataset, _cfg(), seed=9)
    preprocess(tmp_path / "raw", tmp_path / "a", dataset, _cfg())
    first = {p.name: p.read_bytes() for p in sorted((tmp_path / "a").iterdir())}
    preprocess(tmp_path / "raw", tmp_path / "a", dataset, _cfg())
    preprocess(tmp_path / "raw", tmp_path / "b", dataset, _cfg())
    assert sorted(first) == ["meta.json", "test.npz", "train.npz", "val.npz"]
    for folder in ("a", "b"):
        again = {p.name: p.read_bytes() for p in sorted((tmp_path / folder).iterdir())}
        assert again == first


# --- overview ----------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", FLAGS)
def test_overview_panel_is_mosaic_of_first_test_image_per_class(
    tmp_path: Path, dataset: str
) -> None:
    info = dataset_info(dataset)
    generate(tmp_path / "raw", dataset, _cfg(), seed=4)
    preprocess(tmp_path / "raw", tmp_path / "out", dataset, _cfg())
    panels = medmnist.overview_panels(tmp_path / "out")
    assert len(panels) == 1
    panel = panels[0]
    assert panel.mask is None and info.title in panel.title
    assert panel.class_names == dict(enumerate(info.class_names))
    rows = 1 if info.n_classes <= 2 else 2
    cols = -(-info.n_classes // rows)
    shape = (rows * 29 - 1, cols * 29 - 1) + (() if info.channels == 1 else (3,))
    assert panel.image.shape == shape and panel.image.dtype == np.float32
    assert panel.image.min() >= 0.0 and panel.image.max() <= 1.0
    raw = load_npz(tmp_path / "raw" / f"{dataset}.npz", dataset)
    last = info.n_classes - 1
    first = np.flatnonzero(raw["test_labels"] == last)[0]
    r, k = divmod(last, cols)
    tile = panel.image[r * 29 : r * 29 + 28, k * 29 : k * 29 + 28]
    np.testing.assert_allclose(tile, raw["test_images"][first] / 255.0, atol=1e-6)
