"""OCT family (Duke, UMN): MATLAB reader, generator, loaders, preprocessing, overview panel.

Raw files written independently here use scipy.io.savemat (v5) and h5py (v7.3, MATLAB's HDF5
layout: reversed dimensions, cells as object references into `#refs#`) directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
from scipy import ndimage

from dpmed.data import oct
from dpmed.data.oct import load_mat
from dpmed.data.synthetic import oct as synthetic
from dpmed.errors import ConfigError, DataFormatError

DUKE = {
    "grader": 1,
    "size": [32, 32],
    "split": [0.6, 0.2, 0.2],
    "split_seed": 0,
    "synthetic": {"shape": [64, 96], "n_subjects": 10, "n_bscans": 7, "n_annotated": 3},
}
UMN = {
    "grader": 1,
    "size": [32, 32],
    "split": [0.6, 0.2, 0.2],
    "split_seed": 0,
    "synthetic": {"shape": [64, 128], "n_subjects": 6, "n_bscans": 4},
}
CFG = {"duke": DUKE, "umn": UMN}


# ---------------------------------------------------------------- independent raw writers


def _matlab_class(array: np.ndarray) -> str:
    return {"u1": "uint8", "f8": "double", "b1": "logical", "u2": "char"}[array.dtype.str[1:]]


def _write_v73(path: Path, variables: dict) -> None:
    """MATLAB -v7.3 layout: 512-byte user block with the MAT header, every array stored with
    reversed dimensions, cells as (n, 1) datasets of object references into `#refs#`."""
    with h5py.File(path, "w", userblock_size=512) as handle:
        refs = handle.create_group("#refs#")
        for name, value in variables.items():
            if isinstance(value, list):
                targets = []
                for j, item in enumerate(value):
                    target = refs.create_dataset(f"{name}{j}", data=item.T)
                    target.attrs["MATLAB_class"] = np.bytes_(_matlab_class(item))
                    targets.append(target.ref)
                cell = np.array(targets, dtype=h5py.ref_dtype).reshape(len(value), 1)
                node = handle.create_dataset(name, data=cell)
                node.attrs["MATLAB_class"] = np.bytes_("cell")
            else:
                node = handle.create_dataset(name, data=value.T)
                node.attrs["MATLAB_class"] = np.bytes_(_matlab_class(value))
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: test HDF5 schema 1.00 ."
    with open(path, "r+b") as fh:
        fh.write(header.ljust(116) + b"\x00" * 8 + b"\x00\x02" + b"IM")


def _cell(items: list[np.ndarray]) -> np.ndarray:
    """A MATLAB 1×n cell array for scipy.io.savemat (numpy object array)."""
    cell = np.empty((1, len(items)), dtype=object)
    for j, item in enumerate(items):
        cell[0, j] = item
    return cell


def _duke_variables() -> dict[str, np.ndarray]:
    """A tiny Duke subject: H=12, W=6, B=3; only B-scan 1 annotated, in columns 1..4 (column 0
    has 3 boundaries only, column 5 none); column 4 lies one row deeper and boundary 3 has an
    interior NaN gap at column 3 (interpolated to 4.5, rounded half up to 5); grader 2 is
    grader 1 one row deeper. Images stored as whole-valued doubles."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(12, 6, 3)).astype(np.float64)
    layers = np.full((8, 6, 3), np.nan)
    column = np.array([2.0, 3, 4, 5, 6, 7, 8, 9])
    for c in range(1, 5):
        layers[:, c, 1] = column + (c == 4)  # last column one row deeper
    layers[2, 3, 1] = np.nan  # interior gap between 4 (column 2) and 5 (column 4)
    layers[:3, 0, 1] = [2.0, 3, 4]
    fluid = np.full((12, 6, 3), np.nan)
    fluid[:, :, 1] = 0.0
    fluid[5, 3, 1] = 2.0
    return {
        "images": images,
        "manualLayers1": layers,
        "manualLayers2": layers + 1,
        "manualFluid1": fluid,
        "manualFluid2": fluid,
    }


def _expected_duke(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hand-built crop and mask of `_duke_variables` grader 1: columns 1..4 of B-scan 1."""
    regular = [0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0]
    gap = [0, 1, 2, 2, 4, 8, 6, 7, 0, 0, 0, 0]  # boundary 3 at 5; fluid in row 5
    deeper = [0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0]
    mask = np.array([regular, regular, gap, deeper], dtype=np.uint8).T
    return images[:, 1:5, 1].astype(np.uint8), mask


def _umn_arrays() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Two UMN subjects (B = 2 and 3) with double fluid masks holding values 0, 1, 2 and NaN."""
    rng = np.random.default_rng(2)
    volumes = [rng.integers(0, 256, size=(5, 7, n)).astype(np.uint8) for n in (2, 3)]
    fluids = [np.zeros((5, 7, n)) for n in (2, 3)]
    fluids[0][1:3, 2:4, 1] = 1.0
    fluids[1][4, 6, 0] = 2.0
    fluids[1][0, 0, 2] = np.nan
    return volumes, fluids


# ---------------------------------------------------------------- MATLAB reader


def test_load_mat_v5_cells_become_lists_in_matlab_order(tmp_path):
    a, b, c, d = (np.full((2, 3, 2), v, np.uint8) for v in range(4))
    grid = np.empty((2, 2), dtype=object)
    grid[0, 0], grid[0, 1], grid[1, 0], grid[1, 1] = a, b, c, d  # MATLAB {a, b; c, d}
    path = tmp_path / "v5.mat"
    scipy.io.savemat(path, {"row": _cell([a, b]), "grid": grid, "x": np.ones((4, 5, 1))})
    data = load_mat(path, ["row", "grid", "x"])
    assert set(data) == {"row", "grid", "x"}
    assert [item[0, 0, 0] for item in data["row"]] == [0, 1]
    assert [item[0, 0, 0] for item in data["grid"]] == [0, 2, 1, 3]  # column-major
    assert data["row"][0].shape == (2, 3, 2) and data["row"][0].dtype == np.uint8
    assert data["x"].shape == (4, 5, 1)  # numeric arrays are never squeezed
    assert set(load_mat(path, ["x"])) == {"x"}  # only the requested variables


def test_load_mat_v73_transposes_and_dereferences(tmp_path):
    volume = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    other = np.linspace(0, 1, 6).reshape(3, 2, 1)
    path = tmp_path / "v73.mat"
    _write_v73(
        path,
        {
            "images": volume,
            "cells": [volume, other],
            "flag": np.array([[True, False]]),
            "name": np.array([[ord(ch) for ch in "UMN"]], dtype=np.uint16),
        },
    )
    assert h5py.is_hdf5(path)
    data = load_mat(path, ["images", "cells", "flag", "name"])
    np.testing.assert_array_equal(data["images"], volume)
    assert isinstance(data["cells"], list) and len(data["cells"]) == 2
    np.testing.assert_array_equal(data["cells"][0], volume)
    np.testing.assert_array_equal(data["cells"][1], other)
    assert data["flag"].dtype == bool and data["flag"].tolist() == [[True, False]]
    assert data["name"] == "UMN"


def test_load_mat_missing_variable_names_file_and_present_variables(tmp_path):
    v5, v73 = tmp_path / "a.mat", tmp_path / "b.mat"
    scipy.io.savemat(v5, {"images": np.zeros((2, 2, 2)), "other": np.ones((1, 1))})
    _write_v73(v73, {"images": np.zeros((2, 2, 2)), "other": np.ones((1, 1))})
    for path in (v5, v73):
        with pytest.raises(DataFormatError) as err:
            load_mat(path, ["images", "manualLayers1"])
        message = str(err.value)
        assert str(path) in message and "manualLayers1" in message
        assert "images" in message and "other" in message


@pytest.mark.parametrize("kind", ["missing", "garbage", "truncated_v5", "truncated_v73"])
def test_load_mat_unreadable_files(tmp_path, kind):
    path = tmp_path / f"{kind}.mat"
    if kind == "garbage":
        path.write_bytes(b"this is not a MATLAB file" * 10)
    elif kind == "truncated_v5":
        scipy.io.savemat(
            path,
            {"a": np.arange(50.0), "b": np.random.default_rng(0).normal(size=(40, 40))},
            do_compression=True,
        )
        path.write_bytes(path.read_bytes()[:-100])
    elif kind == "truncated_v73":
        _write_v73(path, {"a": np.arange(5000.0).reshape(50, 100)})
        path.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(DataFormatError) as err:
        load_mat(path, ["a"])
    assert str(path) in str(err.value)


# ---------------------------------------------------------------- Duke mask rule


def test_layers_to_mask_matches_hand_built_expectation():
    """H=12, W=3: a regular column, a non-monotone column (boundary 3 above boundary 2, repaired
    by the cumulative max) and a column with half rows (rounded half up, 8th at the last row);
    fluid inside a layer, fluid in the vitreous, NaN fluid (ignored)."""
    boundaries = np.array(
        [
            [2.0, 2.0, 1.5],
            [3.0, 4.0, 2.5],
            [4.0, 3.0, 3.4],
            [5.0, 6.0, 4.6],
            [6.0, 7.0, 6.0],
            [7.0, 8.0, 7.0],
            [8.0, 10.0, 8.0],
            [9.0, 11.0, 12.0],
        ]
    )
    fluid = np.zeros((12, 3))
    fluid[4, 0] = 2.0
    fluid[0, 2] = 1.0
    fluid[5, 1] = np.nan
    expected = np.array(
        [
            [0, 0, 8],
            [1, 1, 1],
            [2, 1, 3],
            [3, 3, 3],
            [8, 3, 4],
            [5, 4, 5],
            [6, 5, 6],
            [7, 6, 7],
            [0, 6, 7],
            [0, 7, 7],
            [0, 0, 7],
            [0, 0, 0],
        ],
        dtype=np.uint8,
    )
    mask = oct.layers_to_mask(boundaries, fluid, 12)
    assert mask.dtype == np.uint8
    np.testing.assert_array_equal(mask, expected)


# ---------------------------------------------------------------- Duke loader


def _duke_folder(folder: Path, n_subjects: int = 1, v73: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, n_subjects + 1):
        variables = _duke_variables()
        if v73:
            _write_v73(folder / f"Subject_{i:02d}.mat", variables)
        else:
            scipy.io.savemat(folder / f"Subject_{i:02d}.mat", variables)
    return folder


@pytest.mark.parametrize("v73", [False, True])
def test_duke_loader_reads_official_layout(tmp_path, v73):
    folder = _duke_folder(tmp_path / "duke", v73=v73)
    samples = list(oct.load_bscans(folder, "duke", grader=1))
    assert len(samples) == 1
    sample = samples[0]
    assert (sample.subject, sample.bscan) == ("Subject_01", 1)
    image, mask = _expected_duke(_duke_variables()["images"])
    np.testing.assert_array_equal(sample.image, image)
    assert sample.image.dtype == np.uint8
    np.testing.assert_array_equal(sample.mask, mask)


def test_duke_grader_two_uses_its_own_annotations(tmp_path):
    folder = _duke_folder(tmp_path / "duke")
    (sample,) = oct.load_bscans(folder, "duke", grader=2)
    regular = [0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0]
    gap = [0, 0, 1, 2, 2, 8, 5, 6, 7, 0, 0, 0]  # boundary 3 at 5.5 → 6; fluid in row 5
    deeper = [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 0]
    expected = np.array([regular, regular, gap, deeper], dtype=np.uint8).T
    np.testing.assert_array_equal(sample.mask, expected)
    with pytest.raises(ConfigError):
        oct.preprocess(folder, tmp_path / "out", "duke", {**DUKE, "grader": 3})


def _bad_duke(variables: dict, case: str) -> dict:
    """Corrupt one aspect of a valid Duke subject."""
    if case == "missing_variable":
        variables.pop("manualFluid1")
    elif case == "images_2d":
        variables["images"] = variables["images"][:, :, 0]
    elif case == "layers_not_8":
        variables["manualLayers1"] = variables["manualLayers1"][:7]
    elif case == "layers_width":
        variables["manualLayers1"] = variables["manualLayers1"][:, :5]
    elif case == "layers_bscans":
        variables["manualLayers1"] = variables["manualLayers1"][:, :, :2]
    elif case == "fluid_shape":
        variables["manualFluid1"] = variables["manualFluid1"][:11]
    elif case == "no_annotation":
        variables["manualLayers1"] = np.full_like(variables["manualLayers1"], np.nan)
    elif case == "no_complete_column":
        variables["manualLayers1"][7] = np.nan
    elif case == "nan_image":
        variables["images"][0, 0, 0] = np.nan
    elif case == "image_range":
        variables["images"][0, 0, 0] = 300.0
    elif case == "cell_not_array":
        variables["images"] = _cell([variables["images"]])
    return variables


@pytest.mark.parametrize(
    "case",
    [
        "missing_variable",
        "images_2d",
        "layers_not_8",
        "layers_width",
        "layers_bscans",
        "fluid_shape",
        "no_annotation",
        "no_complete_column",
        "nan_image",
        "image_range",
        "cell_not_array",
    ],
)
def test_duke_bad_inputs_name_the_file(tmp_path, case):
    folder = tmp_path / "duke"
    folder.mkdir()
    path = folder / "Subject_01.mat"
    scipy.io.savemat(path, _bad_duke(_duke_variables(), case))
    with pytest.raises(DataFormatError) as err:
        list(oct.load_bscans(folder, "duke", grader=1))
    assert str(path) in str(err.value)
    if case == "missing_variable":
        assert "manualFluid1" in str(err.value) and "manualLayers1" in str(err.value)


def test_duke_missing_subject_files(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "notes.txt").write_text("no subjects here")
    for target in (folder, tmp_path / "absent"):
        with pytest.raises(DataFormatError) as err:
            list(oct.load_bscans(target, "duke", grader=1))
        assert str(target) in str(err.value) and "Subject_" in str(err.value)


# ---------------------------------------------------------------- UMN loader


@pytest.mark.parametrize("v73", [False, True])
def test_umn_loader_reads_official_layout(tmp_path, v73):
    volumes, fluids = _umn_arrays()
    folder = tmp_path / "umn"
    folder.mkdir()
    path = folder / "UMNDataset.mat"
    if v73:
        _write_v73(path, {"AllSubjects": volumes, "ManualFluid1": fluids})
    else:
        scipy.io.savemat(path, {"AllSubjects": _cell(volumes), "ManualFluid1": _cell(fluids)})
    samples = list(oct.load_bscans(folder, "umn", grader=1))
    assert [(s.subject, s.bscan) for s in samples] == [
        ("Subject_01", 0),
        ("Subject_01", 1),
        ("Subject_02", 0),
        ("Subject_02", 1),
        ("Subject_02", 2),
    ]
    flat = [(v, f) for v, f in zip(volumes, fluids, strict=True)]
    expected = [(v[:, :, b], f[:, :, b]) for v, f in flat for b in range(v.shape[2])]
    for sample, (image, fluid) in zip(samples, expected, strict=True):
        np.testing.assert_array_equal(sample.image, image)
        np.testing.assert_array_equal(sample.mask, (fluid > 0).astype(np.uint8))  # NaN → 0
    assert int(samples[1].mask.sum()) == 4 and int(samples[2].mask.sum()) == 1


def _bad_umn(case: str) -> dict:
    volumes, fluids = _umn_arrays()
    if case == "missing_variable":
        return {"AllSubjects": _cell(volumes)}
    if case == "cell_lengths":  # fewer images than annotations
        return {"AllSubjects": _cell(volumes[:1]), "ManualFluid1": _cell(fluids)}
    if case == "nan_image":
        noisy = volumes[1].astype(np.float64)
        noisy[2, 2, 1] = np.nan
        volumes[1] = noisy
    elif case == "images_2d":
        volumes[0] = volumes[0][:, :, 0]
    elif case == "fluid_shape":
        fluids[1] = fluids[1][:, :6]
    elif case == "not_a_cell":
        return {"AllSubjects": volumes[0], "ManualFluid1": _cell(fluids)}
    return {"AllSubjects": _cell(volumes), "ManualFluid1": _cell(fluids)}


@pytest.mark.parametrize(
    "case",
    ["missing_variable", "cell_lengths", "nan_image", "images_2d", "fluid_shape", "not_a_cell"],
)
def test_umn_bad_inputs_name_the_file(tmp_path, case):
    folder = tmp_path / "umn"
    folder.mkdir()
    path = folder / "UMNDataset.mat"
    scipy.io.savemat(path, _bad_umn(case))
    with pytest.raises(DataFormatError) as err:
        list(oct.load_bscans(folder, "umn", grader=1))
    assert str(path) in str(err.value)


def _release_shaped_umn(n_images: int, n_annotated: int) -> tuple[list, list, list]:
    """`n_images` subjects (H=4, W=5, B=2, distinct random B-scans) and `n_annotated` fluid
    cells per grader; subject i's fluid marks pixel (i % 4, i % 5) of B-scan 1 (grader 2:
    of B-scan 0), so a mask shows which annotation it was paired with."""
    rng = np.random.default_rng(7)
    volumes = [rng.integers(0, 256, size=(4, 5, 2)).astype(np.uint8) for _ in range(n_images)]
    fluids = {1: [], 2: []}
    for i in range(n_annotated):
        for grader, bscan in ((1, 1), (2, 0)):
            fluid = np.zeros((4, 5, 2))
            fluid[i % 4, i % 5, bscan] = 1.0
            fluids[grader].append(fluid)
    return volumes, fluids[1], fluids[2]


@pytest.mark.parametrize("v73", [False, True])
def test_umn_release_shape_drops_the_unannotated_last_subject(tmp_path, capsys, v73):
    """The release holds 30 `AllSubjects` cells and 29 `ManualFluid1/2` cells: cells 1..29 are
    read paired in order, cell 30 is dropped and reported (stdout and meta.json notes)."""
    volumes, fluid1, fluid2 = _release_shaped_umn(30, 29)
    folder = tmp_path / "umn"
    folder.mkdir()
    path = folder / "UMNDataset.mat"
    if v73:
        _write_v73(path, {"AllSubjects": volumes, "ManualFluid1": fluid1, "ManualFluid2": fluid2})
    else:
        scipy.io.savemat(
            path,
            {
                "AllSubjects": _cell(volumes),
                "ManualFluid1": _cell(fluid1),
                "ManualFluid2": _cell(fluid2),
            },
        )
    for grader, fluids in ((1, fluid1), (2, fluid2)):
        samples = list(oct.load_bscans(folder, "umn", grader=grader))
        assert len(samples) == 29 * 2
        expected = [(i, b) for i in range(29) for b in range(2)]
        for sample, (i, b) in zip(samples, expected, strict=True):
            assert (sample.subject, sample.bscan) == (f"Subject_{i + 1:02d}", b)
            np.testing.assert_array_equal(sample.image, volumes[i][:, :, b])
            np.testing.assert_array_equal(sample.mask, (fluids[i][:, :, b] > 0).astype(np.uint8))
        report = capsys.readouterr().out
        assert str(path) in report and "AllSubjects{30}" in report and "Subject_30" in report
    out = tmp_path / "out"
    oct.preprocess(folder, out, "umn", {**UMN, "size": [4, 5]})
    capsys.readouterr()
    meta = json.loads((out / "meta.json").read_text())
    ids = sorted(s for split in meta["splits"].values() for s in split)
    assert ids == [f"Subject_{i:02d}" for i in range(1, 30)]
    counts = {(c["split"], c["unit"]): c["count"] for c in meta["counts"]}
    assert sum(counts[(split, "subjects")] for split in oct.SPLITS) == 29
    assert sum(counts[(split, "images")] for split in oct.SPLITS) == 29 * 2
    assert "AllSubjects cell 30" in meta["notes"] and "dropped" in meta["notes"]


@pytest.mark.parametrize(("n_images", "n_annotated"), [(30, 27), (29, 30)])
def test_umn_other_cell_count_mismatches_are_refused(tmp_path, n_images, n_annotated):
    volumes, fluid1, _ = _release_shaped_umn(n_images, n_annotated)
    folder = tmp_path / "umn"
    folder.mkdir()
    path = folder / "UMNDataset.mat"
    scipy.io.savemat(path, {"AllSubjects": _cell(volumes), "ManualFluid1": _cell(fluid1)})
    with pytest.raises(DataFormatError) as err:
        list(oct.load_bscans(folder, "umn", grader=1))
    message = str(err.value)
    assert str(path) in message
    assert f"'AllSubjects' ({n_images} cells)" in message
    assert f"'ManualFluid1' ({n_annotated} cells)" in message


def test_umn_missing_file(tmp_path):
    with pytest.raises(DataFormatError) as err:
        list(oct.load_bscans(tmp_path, "umn", grader=1))
    assert "UMNDataset.mat" in str(err.value)


# ---------------------------------------------------------------- preprocessing


def test_preprocess_hand_written_duke_matches_expectation(tmp_path):
    """Two identical subjects, size = crop size (no resampling): images are uint8/255 exactly,
    masks the hand-built ones; meta counts and splits agree."""
    folder = _duke_folder(tmp_path / "duke", n_subjects=2)
    cfg = {**DUKE, "size": [12, 4], "split": [0.5, 0.5, 0.0]}
    out = tmp_path / "out"
    oct.preprocess(folder, out, "duke", cfg)
    image, mask = _expected_duke(_duke_variables()["images"])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["family"] == "oct" and meta["format_version"] == 1
    assert meta["classes"] == {str(k): v for k, v in oct.DUKE_CLASSES.items()}
    assert meta["source_files"] == ["Subject_01.mat", "Subject_02.mat"]
    for split in ("train", "val"):
        with np.load(out / f"{split}.npz") as data:
            assert data["images"].dtype == np.float32 and data["images"].shape == (1, 12, 4)
            np.testing.assert_allclose(data["images"][0], image / 255.0, atol=1e-6)
            np.testing.assert_array_equal(data["masks"][0], mask)
            assert data["masks"].dtype == np.uint8 and data["bscans"].tolist() == [1]
            assert data["subjects"].tolist() == meta["splits"][split]
    with np.load(out / "test.npz") as data:
        assert data["images"].shape == (0, 12, 4)
    counts = {(c["split"], c["unit"], c["class_name"]): c["count"] for c in meta["counts"]}
    assert counts[("train", "images", "all")] == 1 and counts[("test", "subjects", "all")] == 0
    assert counts[("val", "images_with_class", "fluid")] == 1
    assert counts[("val", "images_with_class", "RPE")] == 1


@pytest.mark.parametrize("dataset", ["duke", "umn"])
def test_preprocess_generated_is_deterministic_and_subject_level(tmp_path, dataset):
    cfg = CFG[dataset]
    raw = tmp_path / "raw"
    synthetic.generate(raw, dataset, cfg, seed=5)
    first, second = tmp_path / "a", tmp_path / "b"
    oct.preprocess(raw, first, dataset, cfg)
    oct.preprocess(raw, second, dataset, cfg)
    names = ["train.npz", "val.npz", "test.npz", "meta.json"]
    assert sorted(p.name for p in first.iterdir()) == sorted(names)
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes()
    meta = json.loads((first / "meta.json").read_text())
    splits = meta["splits"]
    all_ids = [s for ids in splits.values() for s in ids]
    assert len(all_ids) == len(set(all_ids)) == cfg["synthetic"]["n_subjects"]
    n_classes = len(oct.classes_of(dataset))
    total = 0
    for split, ids in splits.items():
        with np.load(first / f"{split}.npz") as data:
            n = len(data["images"])
            assert data["images"].shape == (n, 32, 32) and data["masks"].shape == (n, 32, 32)
            assert 0.0 <= data["images"].min() and data["images"].max() <= 1.0
            assert set(data["subjects"].tolist()) == set(ids)
            assert data["masks"].max() < n_classes
            total += n
    per_subject = cfg["synthetic"]["n_annotated" if dataset == "duke" else "n_bscans"]
    assert total == per_subject * cfg["synthetic"]["n_subjects"]
    image_rows = [c for c in meta["counts"] if c["unit"] == "images"]
    assert sum(c["count"] for c in image_rows) == total


def test_overview_panel_has_most_foreground_in_val(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    synthetic.generate(raw, "umn", UMN, seed=2)
    oct.preprocess(raw, out, "umn", UMN)
    (panel,) = oct.overview_panels(out)
    with np.load(out / "val.npz") as data:
        masks, images = data["masks"], data["images"]
    foreground = (masks > 0).sum(axis=(1, 2))
    assert foreground.max() > 0
    best = int(np.argmax(foreground))
    np.testing.assert_array_equal(panel.mask, masks[best])
    np.testing.assert_array_equal(panel.image, images[best])
    assert panel.class_names == {0: "background", 1: "fluid"}


# ---------------------------------------------------------------- generator


@pytest.mark.parametrize("dataset", ["duke", "umn"])
def test_generator_is_deterministic(tmp_path, dataset):
    cfg = CFG[dataset]
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        synthetic.generate(tmp_path / name, dataset, cfg, seed=seed)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "c").iterdir())
    same = [(tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files]
    different = [
        (tmp_path / "a" / f).read_bytes() != (tmp_path / "c" / f).read_bytes() for f in files
    ]
    assert all(same) and all(different)


def test_generated_duke_follows_official_layout(tmp_path):
    synthetic.generate(tmp_path, "duke", DUKE, seed=3)
    height, width = DUKE["synthetic"]["shape"]
    n_bscans = DUKE["synthetic"]["n_bscans"]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"Subject_{i:02d}.mat" for i in range(1, 11)]
    data = scipy.io.loadmat(tmp_path / "Subject_01.mat")
    assert data["images"].dtype == np.uint8 and data["images"].shape == (height, width, n_bscans)
    for g in (1, 2):
        layers, fluid = data[f"manualLayers{g}"], data[f"manualFluid{g}"]
        assert layers.shape == (8, width, n_bscans) and fluid.shape == (height, width, n_bscans)
        annotated = np.flatnonzero(np.isfinite(layers).any(axis=(0, 1)))
        assert len(annotated) == DUKE["synthetic"]["n_annotated"]
        assert np.isnan(fluid[:, :, np.setdiff1d(np.arange(n_bscans), annotated)]).all()
        finite = np.isfinite(layers[0, :, annotated[0]])
        assert 0.6 * width <= finite.sum() <= 0.8 * width and not finite[0] and not finite[-1]
        assert np.isfinite(fluid[:, :, annotated]).all()
    assert not np.array_equal(data["manualLayers1"], data["manualLayers2"], equal_nan=True)


def test_generated_umn_follows_official_layout(tmp_path):
    synthetic.generate(tmp_path, "umn", UMN, seed=3)
    data = scipy.io.loadmat(tmp_path / "UMNDataset.mat")
    n = UMN["synthetic"]["n_subjects"]
    for name in ("AllSubjects", "ManualFluid1", "ManualFluid2"):
        assert data[name].dtype == object and data[name].shape == (1, n)
        assert data[name][0, 0].shape == (64, 128, UMN["synthetic"]["n_bscans"])
    fluid_per_bscan = np.concatenate(
        [(cell > 0).any(axis=(0, 1)) for cell in data["ManualFluid1"][0]]
    )
    assert fluid_per_bscan.any() and not fluid_per_bscan.all()


@pytest.mark.parametrize("dataset", ["duke", "umn"])
def test_generated_fluid_is_darker_than_surrounding_retina(tmp_path, dataset):
    """Learnable structure: fluid pixels are darker than the non-fluid retina within 3 px of
    them (for duke: layer classes 1–7; for umn: bright tissue, i.e. above the image median)."""
    synthetic.generate(tmp_path, dataset, CFG[dataset], seed=4)
    fluid_values, ring_values = [], []
    for sample in oct.load_bscans(tmp_path, dataset, grader=1):
        fluid = sample.mask == (8 if dataset == "duke" else 1)
        if not fluid.any():
            continue
        ring = ndimage.binary_dilation(fluid, iterations=3) & ~fluid
        if dataset == "duke":
            ring &= (sample.mask >= 1) & (sample.mask <= 7)
        else:
            ring &= sample.image > np.median(sample.image)
        fluid_values.append(sample.image[fluid].astype(float))
        ring_values.append(sample.image[ring].astype(float))
    assert fluid_values, "the generator made no fluid"
    fluid_mean = np.concatenate(fluid_values).mean()
    ring_mean = np.concatenate(ring_values).mean()
    assert fluid_mean < 0.5 * ring_mean


@pytest.mark.parametrize("dataset", ["duke", "umn"])
def test_fluid_scale_one_is_the_default_and_larger_scales_grow_the_pockets(tmp_path, dataset):
    cfg = CFG[dataset]
    scaled = {**cfg, "synthetic": {**cfg["synthetic"], "fluid_scale": 1.0}}
    synthetic.generate(tmp_path / "default", dataset, cfg, seed=4)
    synthetic.generate(tmp_path / "one", dataset, scaled, seed=4)
    for path in (tmp_path / "default").iterdir():
        assert path.read_bytes() == (tmp_path / "one" / path.name).read_bytes()
    fluid = {}
    for scale in (1.0, 3.0):
        rng = np.random.default_rng(7)
        _, _, ids, _ = synthetic.retina_volume(rng, 64, 128, 6, fluid_scale=scale)
        fluid[scale] = int((ids > 0).sum())
        assert ids.max() >= 1  # every subject has at least one pocket
        assert not (ids[:, :, 0] > 0).any() and not (ids[:, :, -1] > 0).any()
    # width and height both grow 3×: about 9× the fluid pixels (same pockets, same draws)
    assert fluid[3.0] > 5 * fluid[1.0]
    again = synthetic.retina_volume(np.random.default_rng(7), 64, 128, 6, fluid_scale=3.0)
    assert int((again[2] > 0).sum()) == fluid[3.0]
