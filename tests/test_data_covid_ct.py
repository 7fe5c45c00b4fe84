"""COVID-19 CT family: generator, MedSeg / Inf-Net loaders, preprocessing, overview panel.

Raw files written independently here use nibabel and PIL directly, in the official layouts.
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from dpmed.data import covid_ct
from dpmed.data.synthetic import covid_ct as synthetic
from dpmed.errors import DataFormatError

SMOKE = {
    "size": [32, 32],
    "split": [0.6, 0.2, 0.2],
    "split_seed": 0,
    "synthetic": {"shape": [64, 64], "n_slices": 20},
}


def _write_nib(path: Path, array: np.ndarray) -> None:
    """Write a NIfTI file with plain nibabel (independent of dpmed.data.nifti)."""
    nib.Nifti1Image(array, np.eye(4)).to_filename(str(path))


def _medseg(folder: Path, hu: np.ndarray, labels: np.ndarray) -> Path:
    """A MedSeg-layout folder: float64 HU and float64 labels, as in the release."""
    folder.mkdir(parents=True, exist_ok=True)
    _write_nib(folder / "tr_im.nii.gz", hu.astype(np.float64))
    _write_nib(folder / "tr_mask.nii.gz", labels.astype(np.float64))
    return folder


def _tiny_medseg(folder: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """4×5×5 volume (H×W×N): HU beyond both window edges; per slice a different label mix:
    effusion only, all labels, ground-glass only, consolidation + effusion, clean."""
    rng = np.random.default_rng(0)
    hu = rng.uniform(-1500.0, 500.0, (4, 5, 5)).round()
    labels = np.zeros((4, 5, 5))
    labels[1:3, 1:3, 0] = 3
    labels[:, :, 1] = [[0, 1, 2, 3, 0], [1, 1, 2, 2, 3], [0, 0, 0, 0, 0], [3, 3, 1, 0, 2]]
    labels[2, 2:4, 2] = 1
    labels[0, :, 3] = [2, 2, 3, 3, 0]
    return _medseg(folder, hu, labels), hu, labels


def _infnet(folder: Path, stems: dict[str, tuple[np.ndarray, np.ndarray]], ext: str = ".png"):
    """An Inf-Net-layout folder: Imgs/<stem><ext> images, GT/<stem>.png masks, Edge/ ignored."""
    for sub in ("Imgs", "GT", "Edge"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for stem, (image, truth) in stems.items():
        Image.fromarray(image).save(folder / "Imgs" / f"{stem}{ext}")
        Image.fromarray(truth).save(folder / "GT" / f"{stem}.png")
        Image.fromarray(truth).save(folder / "Edge" / f"{stem}.png")
    return folder


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


# ---------------------------------------------------------------- generator


def test_generator_writes_medseg_layout_deterministically(tmp_path):
    synthetic.generate(tmp_path / "a", "covidct", SMOKE, seed=5)
    synthetic.generate(tmp_path / "b", "covidct", SMOKE, seed=5)
    synthetic.generate(tmp_path / "c", "covidct", SMOKE, seed=6)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["tr_im.nii.gz", "tr_mask.nii.gz"]
    for name in ("tr_im.nii.gz", "tr_mask.nii.gz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    hu = np.asarray(nib.load(str(tmp_path / "a" / "tr_im.nii.gz")).dataobj)
    labels = np.asarray(nib.load(str(tmp_path / "a" / "tr_mask.nii.gz")).dataobj)
    assert hu.shape == labels.shape == (64, 64, 20)
    assert hu.dtype == np.float32 and np.array_equal(hu, np.round(hu))
    assert set(np.unique(labels).tolist()) <= {0, 1, 2, 3}
    ref_hu, ref_labels, _ = synthetic.synthesize((64, 64), 20, seed=5)
    assert np.array_equal(hu, ref_hu) and np.array_equal(labels, ref_labels)


def test_generator_structure_is_learnable():
    hu, labels, lungs = synthetic.synthesize((96, 96), 24, seed=3)
    infection = np.isin(labels, (1, 2))
    healthy_lung = lungs & (labels == 0)
    assert infection.any() and (labels == 1).any() and (labels == 2).any()
    assert not (labels > 0)[~lungs].any(), "every lesion lies inside the lungs"
    assert hu[infection].mean() > hu[healthy_lung].mean() + 200.0
    assert hu[labels == 2].mean() > hu[labels == 1].mean()  # consolidation denser than GGO
    assert hu[healthy_lung].mean() < -700.0
    assert abs(hu[0, 0, :].mean() + 1000.0) < 20.0  # air in the corner
    per_slice = infection.any(axis=(0, 1))
    assert per_slice.any() and not per_slice.all()  # some slices clean
    if (labels == 3).any():
        rows = np.nonzero(labels == 3)[0]
        lung_rows = np.nonzero(lungs)[0]
        assert rows.mean() > lung_rows.mean()  # effusion is posterior (high rows)


def test_generator_runs_fast_at_smoke_size(tmp_path):
    import time

    start = time.perf_counter()
    synthetic.generate(tmp_path / "raw", "covidct", SMOKE, seed=1)
    assert time.perf_counter() - start < 1.0


# ---------------------------------------------------------------- MedSeg loader


def test_medseg_loader_reads_independent_nibabel_files(tmp_path):
    folder, hu, labels = _tiny_medseg(tmp_path / "raw")
    got_hu, got_labels = covid_ct.load_medseg(folder)
    assert got_hu.dtype == np.float32 and np.array_equal(got_hu, hu.astype(np.float32))
    assert got_labels.dtype == np.uint8 and np.array_equal(got_labels, labels)


def test_medseg_loader_reads_generator_output(tmp_path):
    synthetic.generate(tmp_path / "raw", "covidct", SMOKE, seed=2)
    hu, labels = covid_ct.load_medseg(tmp_path / "raw")
    ref_hu, ref_labels, _ = synthetic.synthesize((64, 64), 20, seed=2)
    assert np.array_equal(hu, ref_hu) and np.array_equal(labels, ref_labels)


def test_bad_label_value_names_file_and_value(tmp_path):
    hu = np.zeros((3, 3, 2))
    labels = np.zeros((3, 3, 2))
    labels[1, 1, 1] = 5
    folder = _medseg(tmp_path / "raw", hu, labels)
    with pytest.raises(DataFormatError, match=r"tr_mask\.nii\.gz.*found 5"):
        covid_ct.load_medseg(folder)
    labels[1, 1, 1] = 1.5
    _medseg(folder, hu, labels)
    with pytest.raises(DataFormatError, match=r"tr_mask\.nii\.gz.*1\.5"):
        covid_ct.preprocess(folder, tmp_path / "out", "covidct", SMOKE)


def test_shape_mismatch_names_file(tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    _write_nib(folder / "tr_im.nii.gz", np.zeros((4, 4, 3)))
    _write_nib(folder / "tr_mask.nii.gz", np.zeros((4, 4, 2)))
    with pytest.raises(DataFormatError, match=r"tr_mask\.nii\.gz.*differs"):
        covid_ct.load_medseg(folder)


def test_non_3d_and_non_finite_rejected(tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    _write_nib(folder / "tr_im.nii.gz", np.zeros((4, 4)))
    _write_nib(folder / "tr_mask.nii.gz", np.zeros((4, 4)))
    with pytest.raises(DataFormatError, match=r"tr_im\.nii\.gz.*3-D"):
        covid_ct.load_medseg(folder)
    hu = np.zeros((4, 4, 2))
    hu[0, 0, 0] = np.nan
    _medseg(folder, hu, np.zeros((4, 4, 2)))
    with pytest.raises(DataFormatError, match=r"tr_im\.nii\.gz.*NaN"):
        covid_ct.load_medseg(folder)


def test_truncated_gz_names_file(tmp_path):
    folder, _, _ = _tiny_medseg(tmp_path / "raw")
    path = folder / "tr_im.nii.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match=r"tr_im\.nii\.gz"):
        covid_ct.load_medseg(folder)


def test_missing_mask_names_file(tmp_path):
    folder, _, _ = _tiny_medseg(tmp_path / "raw")
    (folder / "tr_mask.nii.gz").unlink()
    with pytest.raises(DataFormatError, match=r"tr_mask\.nii\.gz.*missing"):
        covid_ct.read_raw(folder)


def test_empty_folder_names_folder(tmp_path):
    with pytest.raises(DataFormatError, match="neither"):
        covid_ct.read_raw(tmp_path)


def test_binary_mapping_and_hu_window_closed_form():
    labels = np.array([[0, 1, 2, 3], [3, 2, 1, 0]], dtype=np.uint8)
    assert np.array_equal(
        covid_ct.binary_infection(labels), np.array([[0, 1, 1, 0], [0, 1, 1, 0]], np.uint8)
    )
    hu = np.array([-2000.0, -1250.0, -1000.0, -500.0, 0.0, 250.0, 1000.0])
    expected = np.clip((hu + 1250.0) / 1500.0, 0.0, 1.0)
    np.testing.assert_allclose(covid_ct.hu_to_unit(hu), expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(covid_ct.hu_to_unit(np.array([-500.0])), [0.5], atol=1e-7)


# ---------------------------------------------------------------- preprocess (MedSeg)


def test_preprocess_medseg_matches_hand_computation(tmp_path):
    folder, hu, labels = _tiny_medseg(tmp_path / "raw")
    cfg = {**SMOKE, "size": [4, 5]}  # original slice size: no resampling
    covid_ct.preprocess(folder, tmp_path / "out", "covidct", cfg)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    seen = []
    for split in ("train", "val", "test"):
        data = _load(tmp_path / "out" / f"{split}.npz")
        assert data["images"].dtype == np.float32 and data["masks"].dtype == np.uint8
        assert data["bscans"].dtype == np.int64
        assert list(data["subjects"]) == meta["splits"][split]
        for image, mask, subject, k in zip(
            data["images"], data["masks"], data["subjects"], data["bscans"], strict=True
        ):
            assert subject == f"slice_{k:03d}"
            expected_mask = ((labels[:, :, k] == 1) | (labels[:, :, k] == 2)).astype(np.uint8)
            assert np.array_equal(mask, expected_mask)
            np.testing.assert_allclose(
                image, np.clip((hu[:, :, k] + 1250) / 1500, 0, 1), rtol=0, atol=1e-6
            )
            seen.append(int(k))
    assert sorted(seen) == list(range(5))
    assert [len(meta["splits"][s]) for s in ("train", "val", "test")] == [3, 1, 1]
    assert meta["family"] == "covid_ct" and meta["format_version"] == 1
    assert meta["classes"] == {"0": "background", "1": "infection"}
    assert meta["source_files"] == ["tr_im.nii.gz", "tr_mask.nii.gz"]
    assert "pleural effusion" in meta["notes"] and "slice-level" in meta["notes"]
    rows = meta["counts"]
    for split in ("train", "val", "test"):
        ks = [int(s.split("_")[1]) for s in meta["splits"][split]]
        by = {(r["unit"], r["class_name"]): r["count"] for r in rows if r["split"] == split}
        assert by[("images", "all")] == len(ks)
        assert by[("images_with_class", "infection")] == sum(
            int(np.isin(labels[:, :, k], (1, 2)).any()) for k in ks
        )
        for value, name in ((1, "ground-glass"), (2, "consolidation"), (3, "pleural effusion")):
            assert by[("voxels", name)] == sum(int((labels[:, :, k] == value).sum()) for k in ks)


def test_preprocess_generator_output_twice_is_byte_identical(tmp_path):
    synthetic.generate(tmp_path / "raw", "covidct", SMOKE, seed=4)
    covid_ct.preprocess(tmp_path / "raw", tmp_path / "one", "covidct", SMOKE)
    covid_ct.preprocess(tmp_path / "raw", tmp_path / "two", "covidct", SMOKE)
    first = {p.name: p.read_bytes() for p in sorted((tmp_path / "one").iterdir())}
    covid_ct.preprocess(tmp_path / "raw", tmp_path / "one", "covidct", SMOKE)  # overwrite
    assert sorted(first) == ["meta.json", "test.npz", "train.npz", "val.npz"]
    for name, data in first.items():
        assert (tmp_path / "two" / name).read_bytes() == data
        assert (tmp_path / "one" / name).read_bytes() == data
    total = 0
    for split in ("train", "val", "test"):
        arrays = _load(tmp_path / "one" / f"{split}.npz")
        assert arrays["images"].shape[1:] == (32, 32)
        assert 0.0 <= arrays["images"].min() and arrays["images"].max() <= 1.0
        assert set(np.unique(arrays["masks"]).tolist()) <= {0, 1}
        total += len(arrays["images"])
    assert total == 20


# ---------------------------------------------------------------- Inf-Net layout


def _infnet_example(rng: np.random.Generator, shape=(6, 7)):
    image = rng.integers(0, 256, shape, dtype=np.uint8)
    truth = np.where(rng.random(shape) < 0.3, 255, 0).astype(np.uint8)
    return image, truth


def test_infnet_loader_and_preprocess(tmp_path):
    rng = np.random.default_rng(1)
    stems = {f"case{i}": _infnet_example(rng) for i in range(5)}
    rgb_image, rgb_truth = _infnet_example(rng)
    stems["rgb"] = (np.stack([rgb_image] * 3, axis=-1), rgb_truth)
    folder = _infnet(tmp_path / "raw", stems)
    slices = covid_ct.load_infnet(folder)
    assert [s for s, _, _ in slices] == sorted(stems)
    for stem, image, mask in slices:
        gray = stems[stem][0] if stem != "rgb" else rgb_image
        np.testing.assert_allclose(image, gray / 255.0, atol=1e-7)
        assert np.array_equal(mask, (stems[stem][1] > 0).astype(np.uint8))
    covid_ct.preprocess(folder, tmp_path / "out", "covidct", {**SMOKE, "size": [6, 7]})
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["layout"] == "infnet"
    assert all(not f.startswith("Edge") for f in meta["source_files"])
    assert len(meta["source_files"]) == 12
    assert not any(r["unit"] == "voxels" for r in meta["counts"])
    for split in ("train", "val", "test"):
        data = _load(tmp_path / "out" / f"{split}.npz")
        for image, mask, stem in zip(data["images"], data["masks"], data["subjects"], strict=True):
            gray = rgb_image if stem == "rgb" else stems[str(stem)][0]
            np.testing.assert_allclose(image, gray / 255.0, rtol=0, atol=1e-6)
            assert np.array_equal(mask, (stems[str(stem)][1] > 0).astype(np.uint8))


def test_infnet_reads_jpg_and_zero_one_gt(tmp_path):
    image = np.tile(np.linspace(0, 255, 16).astype(np.uint8), (16, 1))
    truth = np.zeros((16, 16), np.uint8)
    truth[4:9, 3:7] = 1
    folder = _infnet(tmp_path / "raw", {"a": (image, truth)}, ext=".jpg")
    [(stem, got, mask)] = covid_ct.load_infnet(folder)
    assert stem == "a" and np.abs(got - image / 255.0).max() < 0.05  # JPEG is lossy
    assert np.array_equal(mask, truth)


def test_infnet_unmatched_stem_names_file(tmp_path):
    rng = np.random.default_rng(2)
    folder = _infnet(tmp_path / "raw", {"a": _infnet_example(rng), "b": _infnet_example(rng)})
    (folder / "GT" / "b.png").rename(folder / "GT" / "c.png")
    with pytest.raises(DataFormatError, match=r"Imgs/b\.png.*GT/b\.png"):
        covid_ct.load_infnet(folder)
    (folder / "Imgs" / "b.png").unlink()
    with pytest.raises(DataFormatError, match=r"GT/c\.png.*no matching image"):
        covid_ct.read_raw(folder)


def test_infnet_bad_gt_values_and_size_name_file(tmp_path):
    rng = np.random.default_rng(3)
    image, truth = _infnet_example(rng)
    truth[0, 0] = 128
    folder = _infnet(tmp_path / "raw", {"a": (image, truth)})
    with pytest.raises(DataFormatError, match=r"GT/a\.png.*128"):
        covid_ct.load_infnet(folder)
    Image.fromarray(np.zeros((3, 3), np.uint8)).save(folder / "GT" / "a.png")
    with pytest.raises(DataFormatError, match=r"GT/a\.png.*size"):
        covid_ct.load_infnet(folder)


def test_infnet_corrupt_image_names_file(tmp_path):
    rng = np.random.default_rng(4)
    folder = _infnet(tmp_path / "raw", {"a": _infnet_example(rng, (32, 32))})
    path = folder / "Imgs" / "a.png"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataFormatError, match=r"Imgs/a\.png"):
        covid_ct.load_infnet(folder)


# ---------------------------------------------------------------- overview


def test_overview_panel_is_val_slice_with_most_infection(tmp_path):
    synthetic.generate(tmp_path / "raw", "covidct", SMOKE, seed=7)
    covid_ct.preprocess(tmp_path / "raw", tmp_path / "out", "covidct", SMOKE)
    [panel] = covid_ct.overview_panels(tmp_path / "out")
    val = _load(tmp_path / "out" / "val.npz")
    split, arrays = (
        ("val", val) if val["masks"].any() else ("train", _load(tmp_path / "out" / "train.npz"))
    )
    best = int(np.argmax(arrays["masks"].sum(axis=(1, 2))))
    assert np.array_equal(panel.image, arrays["images"][best])
    assert np.array_equal(panel.mask, arrays["masks"][best])
    assert panel.class_names == {1: "infection"}
    assert split in panel.title and "covidct" in panel.title


def test_lesion_scale_one_is_the_default_and_larger_scales_grow_the_lesions(tmp_path):
    base = {"synthetic": {"shape": [64, 64], "n_slices": 12}}
    one = {"synthetic": {**base["synthetic"], "lesion_scale": 1.0}}
    synthetic.generate(tmp_path / "default", "covidct", base, seed=6)
    synthetic.generate(tmp_path / "one", "covidct", one, seed=6)
    for name in ("tr_im.nii.gz", "tr_mask.nii.gz"):
        assert (tmp_path / "default" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    _, small, lungs = synthetic.synthesize((64, 64), 12, seed=6)
    hu, large, lungs_large = synthetic.synthesize((64, 64), 12, seed=6, lesion_scale=2.5)
    assert np.array_equal(lungs, lungs_large)  # only the lesions change
    infection_small, infection_large = np.isin(small, (1, 2)), np.isin(large, (1, 2))
    assert infection_large.sum() > 2 * infection_small.sum()
    assert not (large > 0)[~lungs].any(), "scaled lesions stay inside the lungs"
    assert np.array_equal(infection_small.any(axis=(0, 1)), infection_large.any(axis=(0, 1)))
    again = synthetic.synthesize((64, 64), 12, seed=6, lesion_scale=2.5)
    assert np.array_equal(hu, again[0]) and np.array_equal(large, again[1])
