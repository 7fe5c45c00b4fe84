"""FeTS 2022 family: synthetic generator, validating loader, preprocessing, federated partitions.

Expectations are computed independently here (nibabel reads, numpy statistics, the real
partition sizes typed in again) rather than through the module under test.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

from dpmed.data import fets
from dpmed.data.synthetic import fets as synth
from dpmed.errors import DataFormatError

REAL_SIZES = [170, 170, 171, 6, 15, 16, 15, 16, 22, 34, 12, 8, 4, 8, 14, 11, 12,
              11, 12, 6, 13, 30, 9, 127, 127, 128, 4, 33, 12, 11, 12, 7, 5]  # fmt: skip
MODS = ["t1", "t1ce", "t2", "flair"]


def smoke_cfg(shape=(32, 32, 24), scale=0.03) -> dict:
    return {
        "raw": "synthetic",
        "partitioning": "partitioning_2.csv",
        "val_fraction": 0.2,
        "split_seed": 0,
        "synthetic": {"shape": list(shape), "subjects_scale": scale},
    }


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, Path, dict]:
    """Synthetic smoke raw folder and its processed folder (generated once per module)."""
    root = tmp_path_factory.mktemp("fets")
    cfg = smoke_cfg()
    synth.generate(root / "raw", "fets", cfg, seed=11)
    fets.preprocess(root / "raw", root / "proc", "fets", cfg)
    return root / "raw", root / "proc", cfg


def load(path: Path) -> np.ndarray:
    return np.asarray(nib.load(str(path)).dataobj)


def raw_subject(raw: Path, sid: str) -> tuple[np.ndarray, np.ndarray]:
    """Raw (4, X, Y, Z) float64 image and seg read with nibabel only."""
    image = np.stack([load(raw / sid / f"{sid}_{m}.nii.gz").astype(np.float64) for m in MODS])
    return image, load(raw / sid / f"{sid}_seg.nii.gz")


def write_subject(raw: Path, sid: str, shape=(6, 7, 5), t1ce_name="t1ce", seed=0) -> None:
    """Write one tiny subject in the official layout with nibabel directly."""
    rng = np.random.default_rng(seed)
    folder = raw / sid
    folder.mkdir(parents=True, exist_ok=True)
    brain = np.zeros(shape, dtype=bool)
    brain[1:-1, 1:-1, 1:-1] = True
    for m in MODS:
        name = t1ce_name if m == "t1ce" else m
        img = np.where(brain, rng.integers(50, 500, shape), 0).astype(np.int16)
        nib.save(nib.Nifti1Image(img, np.eye(4)), str(folder / f"{sid}_{name}.nii.gz"))
    seg = np.zeros(shape, dtype=np.uint8)
    seg[2, 2:4, 2] = [1, 4]
    seg[3, 2:4, 2] = 2
    nib.save(nib.Nifti1Image(seg, np.eye(4)), str(folder / f"{sid}_seg.nii.gz"))


def write_csv(raw: Path, text: str) -> None:
    (raw / "partitioning_2.csv").write_text(text)


def tiny_raw(tmp_path: Path) -> Path:
    """Two-subject raw folder in one partition, written independently."""
    raw = tmp_path / "raw"
    write_subject(raw, "FeTS2022_00001", seed=1)
    write_subject(raw, "FeTS2022_00002", seed=2)
    write_csv(raw, "Partition_ID,Subject_ID\n1,FeTS2022_00001\n1,FeTS2022_00002\n")
    return raw


def all_bytes(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


# ---------------------------------------------------------------- generator


def test_generator_layout_and_partition_sizes(smoke):
    raw, _, cfg = smoke
    expected = [max(2, int(np.floor(n * 0.03 + 0.5))) for n in REAL_SIZES]
    assert len(expected) == 33 and sum(REAL_SIZES) == 1251
    frame = pd.read_csv(raw / "partitioning_2.csv", dtype=str)
    assert list(frame.columns) == ["Partition_ID", "Subject_ID"]
    sizes = frame.groupby(frame["Partition_ID"].astype(int)).size()
    assert sizes.index.tolist() == list(range(1, 34))
    assert sizes.tolist() == expected and min(sizes) >= 2
    assert frame["Subject_ID"].tolist() == [f"FeTS2022_{i:05d}" for i in range(1, len(frame) + 1)]
    assert fets.read_partitions(raw) == {
        int(p): g["Subject_ID"].tolist()
        for p, g in frame.groupby(frame["Partition_ID"].astype(int))
    }
    sid = frame["Subject_ID"].iloc[0]
    for m in MODS:
        img = nib.load(str(raw / sid / f"{sid}_{m}.nii.gz"))
        assert img.get_data_dtype() == np.int16 and img.shape == (32, 32, 24)
    seg = nib.load(str(raw / sid / f"{sid}_seg.nii.gz"))
    assert seg.get_data_dtype() == np.uint8
    assert synth.partition_sizes(0.1) == [max(2, int(np.floor(n * 0.1 + 0.5))) for n in REAL_SIZES]


def test_generator_deterministic(tmp_path):
    cfg = smoke_cfg(shape=(16, 16, 12), scale=0.01)
    synth.generate(tmp_path / "a", "fets", cfg, seed=5)
    synth.generate(tmp_path / "b", "fets", cfg, seed=5)
    synth.generate(tmp_path / "c", "fets", cfg, seed=6)
    a, b, c = (all_bytes(tmp_path / x) for x in "abc")
    assert a == b
    assert a.keys() == c.keys() and a != c


def test_synthetic_tumour_signature(smoke):
    raw, _, _ = smoke
    sids = [p.name for p in sorted(raw.iterdir()) if p.is_dir()]
    kinds = set()
    for sid in sids:
        image, seg = raw_subject(raw, sid)
        assert set(np.unique(seg)) <= {0, 1, 2, 4}
        brain = (image != 0).any(axis=0)
        assert (seg[~brain] == 0).all()
        oedema, normal = seg == 2, brain & (seg == 0)
        assert oedema.any(), sid
        flair, t1ce = image[3], image[1]
        assert flair[oedema].mean() > flair[normal].mean(), sid
        if (seg == 4).any():
            assert t1ce[seg == 4].mean() > t1ce[normal].mean(), sid
        kinds.add(((seg == 1).any(), (seg == 4).any()))
    assert (True, True) in kinds and len(kinds) >= 2  # variety: some subjects lack a region


# ---------------------------------------------------------------- loader


def test_loader_reads_independent_subject_with_alias_and_trainorval(tmp_path):
    raw = tmp_path / "raw"
    write_subject(raw, "FeTS2022_00001", t1ce_name="t1gd", seed=3)
    write_subject(raw, "FeTS2022_00007", seed=4)
    write_csv(
        raw, "Partition_ID,Subject_ID,TrainOrVal\n2,FeTS2022_00007,val\n2,FeTS2022_00001,train\n"
    )
    assert fets.read_partitions(raw) == {2: ["FeTS2022_00007", "FeTS2022_00001"]}
    image, seg, files = fets.read_subject(raw, "FeTS2022_00001")
    assert files["t1ce"].name == "FeTS2022_00001_t1gd.nii.gz"
    sid = "FeTS2022_00001"
    for i, m in enumerate(["t1", "t1gd", "t2", "flair"]):
        np.testing.assert_array_equal(image[i], load(raw / sid / f"{sid}_{m}.nii.gz"))
    np.testing.assert_array_equal(seg, load(raw / sid / f"{sid}_seg.nii.gz"))
    assert image.dtype == np.float32 and seg.dtype == np.uint8
    fets.preprocess(raw, tmp_path / "proc", "fets", smoke_cfg())
    assert [
        (c.partition_id, len(c.train), len(c.val)) for c in fets.collaborators(tmp_path / "proc")
    ] == [(2, 1, 1)]


def _missing_modality(raw: Path) -> str:
    (raw / "FeTS2022_00002" / "FeTS2022_00002_t2.nii.gz").unlink()
    return "FeTS2022_00002_t2.nii.gz"


def _bad_label(raw: Path) -> str:
    path = raw / "FeTS2022_00001" / "FeTS2022_00001_seg.nii.gz"
    seg = load(path).copy()
    seg[2, 2, 2] = 3
    nib.save(nib.Nifti1Image(seg, np.eye(4)), str(path))
    return path.name


def _float_label(raw: Path) -> str:
    path = raw / "FeTS2022_00001" / "FeTS2022_00001_seg.nii.gz"
    seg = load(path).astype(np.float32)
    seg[2, 2, 2] = 1.5
    nib.save(nib.Nifti1Image(seg, np.eye(4)), str(path))
    return path.name


def _shape_mismatch(raw: Path) -> str:
    path = raw / "FeTS2022_00001" / "FeTS2022_00001_flair.nii.gz"
    nib.save(nib.Nifti1Image(np.ones((6, 7, 4), np.int16), np.eye(4)), str(path))
    return path.name


def _seg_shape_mismatch(raw: Path) -> str:
    path = raw / "FeTS2022_00002" / "FeTS2022_00002_seg.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((5, 7, 5), np.uint8), np.eye(4)), str(path))
    return path.name


def _truncated(raw: Path) -> str:
    path = raw / "FeTS2022_00001" / "FeTS2022_00001_t1.nii.gz"
    data = path.read_bytes()
    assert data[:2] == b"\x1f\x8b" and gzip.decompress(data)  # a real gzip file before cutting
    path.write_bytes(data[: len(data) // 2])
    return path.name


def _nan_image(raw: Path) -> str:
    path = raw / "FeTS2022_00002" / "FeTS2022_00002_t1ce.nii.gz"
    img = load(path).astype(np.float32)
    img[3, 3, 3] = np.nan
    nib.save(nib.Nifti1Image(img, np.eye(4)), str(path))
    return path.name


def _empty_brain(raw: Path) -> str:
    for m in MODS:
        path = raw / "FeTS2022_00002" / f"FeTS2022_00002_{m}.nii.gz"
        nib.save(nib.Nifti1Image(np.zeros((6, 7, 5), np.int16), np.eye(4)), str(path))
    return "FeTS2022_00002"


def _wrong_header(raw: Path) -> str:
    write_csv(raw, "Partition,Subject\n1,FeTS2022_00001\n1,FeTS2022_00002\n")
    return "partitioning_2.csv"


def _duplicate_subject(raw: Path) -> str:
    write_csv(raw, "Partition_ID,Subject_ID\n1,FeTS2022_00001\n2,FeTS2022_00001\n")
    return "partitioning_2.csv"


def _missing_folder(raw: Path) -> str:
    write_csv(raw, "Partition_ID,Subject_ID\n1,FeTS2022_00001\n1,FeTS2022_00009\n")
    return "partitioning_2.csv"


def _bad_partition_id(raw: Path) -> str:
    write_csv(raw, "Partition_ID,Subject_ID\nA,FeTS2022_00001\n1,FeTS2022_00002\n")
    return "partitioning_2.csv"


@pytest.mark.parametrize(
    "corrupt",
    [
        _missing_modality,
        _bad_label,
        _float_label,
        _shape_mismatch,
        _seg_shape_mismatch,
        _truncated,
        _nan_image,
        _empty_brain,
        _wrong_header,
        _duplicate_subject,
        _missing_folder,
        _bad_partition_id,
    ],
)
def test_bad_inputs_raise_naming_file(tmp_path, corrupt):
    raw = tiny_raw(tmp_path)
    fets.preprocess(raw, tmp_path / "ok", "fets", smoke_cfg())  # the clean folder is valid
    name = corrupt(raw)
    with pytest.raises(DataFormatError) as info:
        fets.preprocess(raw, tmp_path / "proc", "fets", smoke_cfg())
    assert name in str(info.value)
    assert not (tmp_path / "proc" / "subjects").exists()  # nothing half-written
    assert not (tmp_path / "proc" / "meta.json").exists()


def test_bad_label_message_lists_values(tmp_path):
    raw = tiny_raw(tmp_path)
    _bad_label(raw)
    with pytest.raises(DataFormatError, match=r"\[3\]"):
        fets.read_subject(raw, "FeTS2022_00001")


# ---------------------------------------------------------------- preprocessing


def test_split_per_institution(smoke):
    raw, proc, _ = smoke
    splits = pd.read_csv(proc / "splits.csv", dtype={"subject_id": str})
    assert list(splits.columns) == ["subject_id", "partition_id", "split"]
    parts = pd.read_csv(raw / "partitioning_2.csv", dtype={"Subject_ID": str})
    assert sorted(splits["subject_id"]) == sorted(parts["Subject_ID"])
    merged = splits.merge(parts, left_on="subject_id", right_on="Subject_ID")
    assert (merged["partition_id"] == merged["Partition_ID"]).all()
    for _, group in splits.groupby("partition_id"):
        n, n_val = len(group), int((group["split"] == "val").sum())
        assert n_val == max(1, round(0.2 * n))
        assert n - n_val >= 1
    meta = json.loads((proc / "meta.json").read_text())
    for split in ("train", "val"):
        assert meta["splits"][split] == sorted(splits.loc[splits["split"] == split, "subject_id"])


def test_zscore_crop_and_labels_match_raw(smoke):
    raw, proc, _ = smoke
    meta = json.loads((proc / "meta.json").read_text())
    for sid in meta["splits"]["val"][:4] + meta["splits"]["train"][:4]:
        image, seg = raw_subject(raw, sid)
        brain = (image != 0).any(axis=0)
        keep = brain | (seg > 0)
        box = [
            (
                int(np.flatnonzero(keep.any(axis=ax))[0]),
                int(np.flatnonzero(keep.any(axis=ax))[-1]) + 1,
            )
            for ax in [(1, 2), (0, 2), (0, 1)]
        ]
        assert meta["subjects"][sid]["crop_box"] == [list(b) for b in box]
        assert meta["subjects"][sid]["original_shape"] == list(seg.shape)
        sl = tuple(slice(a, b) for a, b in box)
        pimg, plab = fets.load_subject(proc, sid)
        assert isinstance(pimg, np.memmap) and pimg.dtype == np.float16
        np.testing.assert_array_equal(plab, seg[sl])
        assert plab.dtype == np.uint8 and seg.sum() == plab.sum()  # no label voxel lost
        for c in range(4):
            vals = image[c][brain]
            expected = (image[c][sl] - vals.mean()) / vals.std()
            got = pimg[c].astype(np.float64)
            np.testing.assert_allclose(got[brain[sl]], expected[brain[sl]], atol=2e-2, rtol=1e-3)
            assert (got[~brain[sl]] == 0).all()
            assert abs(got[brain[sl]].mean()) < 1e-2 and abs(got[brain[sl]].std() - 1) < 1e-2


def test_meta_counts(smoke):
    _, proc, _ = smoke
    meta = json.loads((proc / "meta.json").read_text())
    assert meta["family"] == "fets" and meta["format_version"] == 1
    assert meta["classes"] == {"0": "background", "1": "NCR", "2": "ED", "4": "ET"}
    assert meta["modalities"] == MODS
    counts = pd.DataFrame(meta["counts"])
    splits = pd.read_csv(proc / "splits.csv", dtype={"subject_id": str})
    subj = counts[(counts["unit"] == "subjects") & (counts["institution"] != "all")]
    expected = splits.groupby(["split", "partition_id"]).size()
    got = subj.set_index(["split", subj["institution"].astype(int)])["count"]
    assert got.sort_index().tolist() == expected.sort_index().tolist()
    for split in ("train", "val"):
        labels = [fets.load_subject(proc, s)[1] for s in meta["splits"][split]]
        direct = {n: sum(int((lab == v).sum()) for lab in labels)
                  for v, n in [(0, "background"), (1, "NCR"), (2, "ED"), (4, "ET")]}  # fmt: skip
        rows = counts[(counts["unit"] == "voxels") & (counts["split"] == split)]
        assert dict(zip(rows["class_name"], rows["count"], strict=True)) == direct
        total = counts[(counts["unit"] == "subjects") & (counts["institution"] == "all")]
        assert total.set_index("split")["count"][split] == len(meta["splits"][split])
    assert "partitioning_2.csv" in meta["source_files"]


def test_preprocess_twice_identical(tmp_path, smoke):
    raw, proc, cfg = smoke
    fets.preprocess(raw, tmp_path / "again", "fets", cfg)
    assert all_bytes(tmp_path / "again") == all_bytes(proc)
    fets.preprocess(raw, tmp_path / "again", "fets", cfg)  # into an existing folder
    assert all_bytes(tmp_path / "again") == all_bytes(proc)


# ---------------------------------------------------------------- federated access and figures


def test_collaborators_match_splits(smoke):
    _, proc, _ = smoke
    splits = pd.read_csv(proc / "splits.csv", dtype={"subject_id": str})
    collabs = fets.collaborators(proc)
    assert [c.partition_id for c in collabs] == list(range(1, 34))
    for c in collabs:
        rows = splits[splits["partition_id"] == c.partition_id]
        assert c.train == tuple(sorted(rows.loc[rows["split"] == "train", "subject_id"]))
        assert c.val == tuple(sorted(rows.loc[rows["split"] == "val", "subject_id"]))
    with pytest.raises(AttributeError):
        collabs[0].partition_id = 5  # frozen
    table = fets.patients_per_institution(proc)
    assert list(table.columns) == ["partition_id", "n_train", "n_val", "n_total"]
    assert table["n_total"].tolist() == splits.groupby("partition_id").size().tolist()
    assert (table["n_train"] + table["n_val"] == table["n_total"]).all()
    image, label = fets.load_subject(proc, collabs[0].train[0], mmap=False)
    assert not isinstance(image, np.memmap) and label.shape == image.shape[1:]


def test_overview_panel(smoke):
    _, proc, _ = smoke
    (panel,) = fets.overview_panels(proc)
    meta = json.loads((proc / "meta.json").read_text())
    first = next(s for s in meta["splits"]["val"] if fets.load_subject(proc, s)[1].any())
    assert first in panel.title
    _, label = fets.load_subject(proc, first)
    z = int(np.argmax((label > 0).sum(axis=(0, 1))))
    np.testing.assert_array_equal(panel.mask, np.rot90(label[:, :, z]))
    assert panel.image.shape == panel.mask.shape and panel.image.dtype == np.float32
    assert panel.image.min() >= 0 and panel.image.max() <= 1 and panel.image.max() > 0.9
    assert set(np.unique(panel.mask)) <= {0, 1, 2, 4} and (panel.mask > 0).any()
    assert panel.class_names == {1: "NCR", 2: "ED", 4: "ET"}


def test_load_subject_missing_names_file(smoke):
    _, proc, _ = smoke
    with pytest.raises(DataFormatError, match="FeTS2022_99999.image.npy"):
        fets.load_subject(proc, "FeTS2022_99999")


def test_truncated_generator_file_names_file(tmp_path, smoke):
    raw, _, _ = smoke
    sid = "FeTS2022_00001"
    shutil.copytree(raw / sid, tmp_path / sid)
    path = tmp_path / sid / f"{sid}_flair.nii.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # header intact, voxel data cut
    with pytest.raises(DataFormatError, match=f"{sid}_flair.nii.gz"):
        fets.read_subject(tmp_path, sid)
