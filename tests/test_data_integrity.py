"""Corrupted inputs: the reader raises DataFormatError naming the file, and a failed preprocess
leaves no processed files behind.

Gzip files are re-stored with deflate level 0 before 32 bytes in the middle are flipped, so the
flip lands in voxel data with the gzip header and trailer intact: inflating still succeeds and
only the CRC-32 in the trailer can tell, which nibabel alone never reads.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from dpmed.data import covid_ct, medmnist, oct, stage
from dpmed.data.nifti import read_nifti
from dpmed.data.synthetic import covid_ct as synth_covid
from dpmed.data.synthetic import fets as synth_fets
from dpmed.data.synthetic import medmnist as synth_medmnist
from dpmed.errors import DataFormatError
from dpmed.seg.data import load_seg_data
from dpmed.xcal.federation import load_split

FETS = {
    "partitioning": "partitioning_2.csv",
    "val_fraction": 0.2,
    "split_seed": 0,
    "synthetic": {"shape": [8, 8, 8], "subjects_scale": 0.01},
}
COVID = {
    "size": [16, 16],
    "split": [0.6, 0.2, 0.2],
    "split_seed": 0,
    "synthetic": {"shape": [16, 16], "n_slices": 10},
}
MEDMNIST = {"size": 28, "synthetic": {"counts": [16, 8, 8]}}
FLIPPED = 32


def flip_middle(path: Path) -> None:
    """XOR 32 bytes in the middle of `path`, keeping a gzip header (10) and trailer (8) intact."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2 - FLIPPED // 2
    assert start >= 10 and start + FLIPPED <= len(data) - 8
    data[start : start + FLIPPED] = bytes(b ^ 0xFF for b in data[start : start + FLIPPED])
    path.write_bytes(bytes(data))


def store_uncompressed(path: Path) -> None:
    """Rewrite a `.gz` file as the same stream in stored (level 0) deflate blocks."""
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()), 0, mtime=0))


def corrupt_nifti(path: Path) -> None:
    """Flip voxel bytes of a `.nii.gz` and check nibabel alone still reads it (the defect)."""
    clean = np.asarray(nib.load(str(path)).dataobj)
    store_uncompressed(path)
    flip_middle(path)
    garbled = np.asarray(nib.load(str(path)).dataobj)
    assert garbled.shape == clean.shape and not np.array_equal(garbled, clean)


def leftovers(folder: Path) -> list[Path]:
    """Everything under `folder` (the stand-in for data/processed/)."""
    return sorted(folder.rglob("*")) if folder.exists() else []


def assert_corrupt(err: pytest.ExceptionInfo, path: Path) -> None:
    """The error names `path` and says the file is corrupt (not some later symptom)."""
    assert err.value.path == str(path) and str(err.value).startswith(str(path))
    assert "corrupt" in err.value.problem


@pytest.fixture(scope="module")
def processed(tmp_path_factory) -> dict[str, Path]:
    """Clean processed folders of pneumoniamnist and covidct (preprocessed once per module)."""
    root = tmp_path_factory.mktemp("clean")
    synth_medmnist.generate(root / "raw" / "pneumoniamnist", "pneumoniamnist", MEDMNIST, 0)
    synth_covid.generate(root / "raw" / "covidct", "covidct", COVID, 0)
    out = {}
    for dataset, cfg in (("pneumoniamnist", MEDMNIST), ("covidct", COVID)):
        out[dataset] = root / "processed" / dataset
        stage.preprocess(dataset, cfg, root / "raw" / dataset, out[dataset])
    return out


def copy_processed(processed: dict[str, Path], dataset: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(processed[dataset], tmp_path / dataset))


# ------------------------------------------------------------------------ raw .nii.gz


@pytest.mark.parametrize("kind", ["crc", "isize"])
def test_read_nifti_checks_the_gzip_trailer(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "vol.nii.gz"
    nib.save(nib.Nifti1Image(np.arange(1, 4097, dtype=np.int16).reshape(16, 16, 16), None), path)
    if kind == "crc":
        corrupt_nifti(path)
    else:  # a wrong uncompressed length (ISIZE, the last 4 bytes); the data are intact
        data = bytearray(path.read_bytes())
        data[-4] ^= 0x01
        path.write_bytes(bytes(data))
        assert np.asarray(nib.load(str(path)).dataobj).shape == (16, 16, 16)
    with pytest.raises(DataFormatError) as err:
        read_nifti(path)
    assert_corrupt(err, path)


def test_fets_corrupt_subject_is_named_and_nothing_written(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "processed" / "fets"
    synth_fets.generate(raw, "fets", FETS, 0)
    last = sorted(p.name for p in raw.iterdir() if p.is_dir())[-1]  # earlier ones get written
    bad = raw / last / f"{last}_t1.nii.gz"
    corrupt_nifti(bad)
    with pytest.raises(DataFormatError) as err:
        stage.preprocess("fets", FETS, raw, out)
    assert_corrupt(err, bad)
    assert leftovers(out.parent) == []


@pytest.mark.parametrize("name", [covid_ct.IMAGE_FILE, covid_ct.MASK_FILE])
def test_covid_ct_corrupt_medseg_is_named_and_nothing_written(tmp_path: Path, name: str) -> None:
    raw, out = tmp_path / "raw", tmp_path / "processed" / "covidct"
    synth_covid.generate(raw, "covidct", COVID, 0)
    corrupt_nifti(raw / name)
    with pytest.raises(DataFormatError) as err:
        stage.preprocess("covidct", COVID, raw, out)
    assert_corrupt(err, raw / name)
    assert leftovers(out.parent) == []


# ------------------------------------------------------------------------ .npz


def test_medmnist_corrupt_compressed_npz_is_named_and_nothing_written(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "processed" / "pneumoniamnist"
    synth_medmnist.generate(raw, "pneumoniamnist", MEDMNIST, 0)
    path = raw / medmnist.npz_name("pneumoniamnist", 28)
    with np.load(path) as npz:
        arrays = {key: npz[key] for key in npz.files}
    with open(path, "wb") as fh:  # deflated members: the flip breaks the zlib stream
        np.savez_compressed(fh, **arrays)
    flip_middle(path)
    with pytest.raises(DataFormatError) as err:
        stage.preprocess("pneumoniamnist", MEDMNIST, raw, out)
    assert_corrupt(err, path)
    assert leftovers(out.parent) == []


@pytest.mark.parametrize("reader", ["xcal.load_split", "medmnist.overview_panels"])
def test_processed_medmnist_split_corrupt_is_named(
    processed: dict[str, Path], tmp_path: Path, reader: str
) -> None:
    folder = copy_processed(processed, "pneumoniamnist", tmp_path)
    flip_middle(folder / "test.npz")
    with pytest.raises(DataFormatError) as err:
        if reader == "xcal.load_split":
            load_split(folder, "test")
        else:
            medmnist.overview_panels(folder)
    assert_corrupt(err, folder / "test.npz")


@pytest.mark.parametrize(
    ("reader", "split"),
    [("seg.load_seg_data", "train"), ("covid_ct.overview_panels", "val"), ("oct", "val")],
)
def test_processed_seg_split_corrupt_is_named(
    processed: dict[str, Path], tmp_path: Path, reader: str, split: str
) -> None:
    """The 2D-segmentation format is shared by covid_ct and oct, so one folder serves both."""
    folder = copy_processed(processed, "covidct", tmp_path)
    flip_middle(folder / f"{split}.npz")
    with pytest.raises(DataFormatError) as err:
        if reader == "seg.load_seg_data":
            load_seg_data(folder, "covidct")
        elif reader == "covid_ct.overview_panels":
            covid_ct.overview_panels(folder)
        else:
            oct.overview_panels(folder)
    assert_corrupt(err, folder / f"{split}.npz")


# ------------------------------------------------------------------------ the stage


class _FailingFamily:
    """A family whose preprocess writes one split and then finds a corrupt raw file."""

    @staticmethod
    def preprocess(raw_dir: Path, out_dir: Path, dataset: str, cfg: dict) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "train.npz").write_bytes(b"new")
        raise DataFormatError(raw_dir / "b.nii.gz", "corrupt")


@pytest.mark.parametrize("previous", [False, True])
def test_failed_stage_leaves_the_output_folder_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, previous: bool
) -> None:
    out = tmp_path / "processed" / "fake"
    if previous:  # a complete earlier result stays whole, not mixed with the failed run
        out.mkdir(parents=True)
        for name in ("train.npz", "meta.json"):
            (out / name).write_bytes(b"old")
    before = {p: p.read_bytes() for p in leftovers(out.parent) if p.is_file()}
    monkeypatch.setattr(stage, "family_module", lambda dataset: _FailingFamily)
    with pytest.raises(DataFormatError, match="b.nii.gz"):
        stage.preprocess("fake", {}, tmp_path / "raw", out)
    assert {p: p.read_bytes() for p in leftovers(out.parent) if p.is_file()} == before
    assert [p for p in leftovers(out.parent) if p.is_dir()] == ([out] if previous else [])


def test_successful_stage_replaces_the_whole_folder(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "processed" / "pneumoniamnist"
    synth_medmnist.generate(raw, "pneumoniamnist", MEDMNIST, 0)
    out.mkdir(parents=True)
    (out / "stale.npz").write_bytes(b"from an older format")
    stage.preprocess("pneumoniamnist", MEDMNIST, raw, out)
    assert sorted(p.name for p in leftovers(out.parent)) == [
        "meta.json",
        "pneumoniamnist",
        "test.npz",
        "train.npz",
        "val.npz",
    ]
