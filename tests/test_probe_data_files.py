"""Probe class "data files": a bad raw file of every dataset kind stops preprocessing with a
`DataFormatError` naming the file and what is wrong, and leaves nothing in data/processed/.

Every case starts from a clean synthetic raw folder of its kind, spoils one thing (an empty
split a study trains or evaluates on, a truncated or corrupt file, NaN images, wrong shapes, a
missing file, labels outside the documented set, ...) and preprocesses it as the workflow does
(`dpmed.data.stage.preprocess`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import scipy.io
from PIL import Image

from dpmed.data import stage
from dpmed.data.synthetic import covid_ct as synth_covid
from dpmed.data.synthetic import fets as synth_fets
from dpmed.data.synthetic import medmnist as synth_medmnist
from dpmed.data.synthetic import oct as synth_oct
from dpmed.errors import DataFormatError

SPLIT = {"split": [0.6, 0.2, 0.2], "split_seed": 0}
CFG = {
    "pneumoniamnist": {"size": 28, "synthetic": {"counts": [12, 6, 6]}},
    "duke": {"grader": 1, "size": [16, 16], **SPLIT,
             "synthetic": {"shape": [32, 48], "n_subjects": 3, "n_bscans": 4, "n_annotated": 2}},
    "umn": {"grader": 1, "size": [16, 16], **SPLIT,
            "synthetic": {"shape": [32, 48], "n_subjects": 3, "n_bscans": 2}},
    "covidct": {"size": [16, 16], **SPLIT, "synthetic": {"shape": [16, 16], "n_slices": 6}},
    "fets": {"partitioning": "partitioning_2.csv", "val_fraction": 0.2, "split_seed": 0,
             "synthetic": {"shape": [8, 8, 8], "subjects_scale": 0.01}},
}  # fmt: skip
GENERATORS = {"pneumoniamnist": synth_medmnist, "duke": synth_oct, "umn": synth_oct,
              "covidct": synth_covid, "fets": synth_fets}  # fmt: skip
NPZ = "pneumoniamnist.npz"


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict[str, Path]:
    """One clean synthetic raw folder per dataset kind (the Inf-Net layout written by hand)."""
    root = tmp_path_factory.mktemp("clean_raw")
    out = {}
    for dataset, module in GENERATORS.items():
        module.generate(root / dataset, dataset, CFG[dataset], 0)
        out[dataset] = root / dataset
    infnet = root / "infnet"
    for k in range(6):
        image = np.full((16, 16), 40 * k, dtype=np.uint8)
        truth = np.zeros((16, 16), dtype=np.uint8)
        truth[4:8, 4:8] = 255
        for folder, array in (("Imgs", image), ("GT", truth)):
            (infnet / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(array).save(infnet / folder / f"slice{k}.png")
    out["infnet"] = infnet
    return out


# ------------------------------------------------------------------ spoilers: raw → bad file


def edit_npz(**change: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], str]:
    """Rewrite the MedMNIST npz with `change[key](array)` for each key (None drops the key)."""

    def spoil(raw: Path) -> str:
        arrays = dict(np.load(raw / NPZ))
        for key, edit in change.items():
            if edit is None:
                arrays.pop(key)
            else:
                arrays[key] = edit(arrays[key])
        np.savez(raw / NPZ, **arrays)
        return NPZ

    return spoil


def empty(array: np.ndarray) -> np.ndarray:
    return array[:0]


def truncate(name: str) -> Callable[[Path], str]:
    def spoil(raw: Path) -> str:
        data = (raw / name).read_bytes()
        (raw / name).write_bytes(data[: len(data) // 2])
        return name

    return spoil


def garble(name: str) -> Callable[[Path], str]:
    def spoil(raw: Path) -> str:
        (raw / name).write_bytes(b"this is not the file you are looking for" * 8)
        return name

    return spoil


def remove(name: str, named: str | None = None) -> Callable[[Path], str]:
    """Delete `name`; the error names `named` (default: the deleted file)."""

    def spoil(raw: Path) -> str:
        (raw / name).unlink()
        return name if named is None else named

    return spoil


def edit_mat(name: str, change: Callable[[dict], None]) -> Callable[[Path], str]:
    """Rewrite a MATLAB v5 file with `change(variables)` applied."""

    def spoil(raw: Path) -> str:
        variables = {
            k: v for k, v in scipy.io.loadmat(raw / name).items() if not k.startswith("__")
        }
        change(variables)
        scipy.io.savemat(raw / name, variables)
        return name

    return spoil


def first_duke(raw: Path) -> str:
    return sorted(p.name for p in raw.glob("Subject_*.mat"))[0]


def edit_duke(change: Callable[[dict], None]) -> Callable[[Path], str]:
    return lambda raw: edit_mat(first_duke(raw), change)(raw)


def duke_nan(variables: dict) -> None:
    images = variables["images"].astype(np.float64)
    images[0, 0, 0] = np.nan
    variables["images"] = images


def umn_keep(n: int) -> Callable[[dict], None]:
    def change(variables: dict) -> None:
        for key in ("AllSubjects", "ManualFluid1", "ManualFluid2"):
            variables[key] = variables[key][:, :n]

    return change


def umn_fluid_shape(variables: dict) -> None:
    variables["ManualFluid1"][0, 0] = variables["ManualFluid1"][0, 0][:-1]


def umn_out_of_range(variables: dict) -> None:
    volume = variables["AllSubjects"][0, 0].astype(np.float64)
    volume[0, 0, 0] = 300.0
    variables["AllSubjects"][0, 0] = volume


def duke_keep_two(raw: Path) -> str:
    (raw / first_duke(raw)).unlink()
    return "."


def duke_none(raw: Path) -> str:
    for path in raw.glob("Subject_*.mat"):
        path.unlink()
    return "."


def edit_nifti(name: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], str]:
    """Rewrite a NIfTI volume with `change(array)` (keeping its affine)."""

    def spoil(raw: Path) -> str:
        image = nib.load(raw / name)
        array = change(np.asarray(image.dataobj))
        nib.save(nib.Nifti1Image(array, image.affine), raw / name)
        return name

    return spoil


def medseg_keep(n: int) -> Callable[[Path], str]:
    def spoil(raw: Path) -> str:
        for name in ("tr_mask.nii.gz", "tr_im.nii.gz"):
            edit_nifti(name, lambda a: a[:, :, :n])(raw)
        return "tr_im.nii.gz"

    return spoil


def with_value(value: float, at: tuple[int, ...] = (0, 0, 0)) -> Callable[[np.ndarray], np.ndarray]:
    def change(array: np.ndarray) -> np.ndarray:
        array = array.astype(np.float32)
        array[at] = value
        return array

    return change


def infnet_keep_two(raw: Path) -> str:
    for k in range(2, 6):
        (raw / "Imgs" / f"slice{k}.png").unlink()
        (raw / "GT" / f"slice{k}.png").unlink()
    return "Imgs"


def infnet_gray_truth(raw: Path) -> str:
    Image.fromarray(np.full((16, 16), 7, dtype=np.uint8)).save(raw / "GT" / "slice0.png")
    return "GT/slice0.png"


def fets_subject(raw: Path, k: int = 0) -> str:
    return sorted(p.name for p in raw.iterdir() if p.is_dir())[k]


def fets_file(kind: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], str]:
    def spoil(raw: Path) -> str:
        sid = fets_subject(raw)
        return edit_nifti(f"{sid}/{sid}_{kind}.nii.gz", change)(raw)

    return spoil


def fets_lone_subject(raw: Path) -> str:
    """Move one subject into a partition of its own: its train split would be empty."""
    csv = raw / "partitioning_2.csv"
    lines = csv.read_text().splitlines()
    header, first = lines[0], lines[1].split(",")
    csv.write_text("\n".join([header, ",".join(["999", *first[1:]]), *lines[2:]]) + "\n")
    return "partitioning_2.csv"


def fets_remove(kind: str) -> Callable[[Path], str]:
    def spoil(raw: Path) -> str:
        sid = fets_subject(raw)
        return remove(f"{sid}/{sid}_{kind}.nii.gz")(raw)

    return spoil


def fets_truncate(raw: Path) -> str:
    sid = fets_subject(raw)
    return truncate(f"{sid}/{sid}_t2.nii.gz")(raw)


def fets_header(raw: Path) -> str:
    csv = raw / "partitioning_2.csv"
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join(["Institution,Subject", *lines[1:]]) + "\n")
    return "partitioning_2.csv"


def fets_missing_folder(raw: Path) -> str:
    shutil.rmtree(raw / fets_subject(raw))
    return "partitioning_2.csv"


# (case id, raw kind, dataset, spoiler, words the problem must contain)
CASES = [
    # MedMNIST: xcal trains on train, audits on val and test, tests on test
    ("medmnist-empty-test", "pneumoniamnist", "pneumoniamnist",
     edit_npz(test_images=empty, test_labels=empty), ["test_images", "no image"]),
    ("medmnist-empty-val", "pneumoniamnist", "pneumoniamnist",
     edit_npz(val_images=empty, val_labels=empty), ["val_images", "no image"]),
    ("medmnist-empty-train", "pneumoniamnist", "pneumoniamnist",
     edit_npz(train_images=empty, train_labels=empty), ["train_images", "no image"]),
    ("medmnist-truncated", "pneumoniamnist", "pneumoniamnist", truncate(NPZ), ["corrupt"]),
    ("medmnist-garbled", "pneumoniamnist", "pneumoniamnist", garble(NPZ), ["not an npz"]),
    ("medmnist-missing", "pneumoniamnist", "pneumoniamnist", remove(NPZ), ["not found"]),
    ("medmnist-missing-key", "pneumoniamnist", "pneumoniamnist",
     edit_npz(val_labels=None), ["missing", "val_labels"]),
    ("medmnist-label-too-big", "pneumoniamnist", "pneumoniamnist",
     edit_npz(test_labels=lambda a: a + 2), ["test_labels", "values span"]),
    ("medmnist-label-negative", "pneumoniamnist", "pneumoniamnist",
     edit_npz(train_labels=lambda a: a.astype(np.int64) - 1), ["train_labels", "values span"]),
    ("medmnist-nan-images", "pneumoniamnist", "pneumoniamnist",
     edit_npz(val_images=lambda a: np.full(a.shape, np.nan, np.float32)), ["val_images", "dtype"]),
    ("medmnist-rgb-for-gray", "pneumoniamnist", "pneumoniamnist",
     edit_npz(train_images=lambda a: np.stack([a] * 3, -1)), ["train_images", "grayscale"]),
    ("medmnist-label-count", "pneumoniamnist", "pneumoniamnist",
     edit_npz(test_labels=lambda a: a[:-1]), ["test_labels", "labels"]),
    ("medmnist-not-square", "pneumoniamnist", "pneumoniamnist",
     edit_npz(test_images=lambda a: a[:, :, :-1]), ["test_images", "square"]),
    # Duke / UMN OCT: seg trains on train, scores val every epoch and test at the end
    ("duke-empty-split", "duke", "duke", duke_keep_two, ["train split", "empty"]),
    ("duke-no-subjects", "duke", "duke", duke_none, ["no Subject_*.mat"]),
    ("duke-missing-variable", "duke", "duke",
     edit_duke(lambda v: v.pop("manualFluid1")), ["manualFluid1"]),
    ("duke-truncated", "duke", "duke", lambda raw: truncate(first_duke(raw))(raw), ["truncated"]),
    ("duke-nan-images", "duke", "duke", edit_duke(duke_nan), ["'images'", "NaN"]),
    ("duke-images-2d", "duke", "duke",
     edit_duke(lambda v: v.update(images=v["images"][:, :, 0])), ["'images'", "3-D"]),
    ("umn-empty-split", "umn", "umn", edit_mat("UMNDataset.mat", umn_keep(2)),
     ["train split", "empty"]),
    ("umn-no-subjects", "umn", "umn", edit_mat("UMNDataset.mat", umn_keep(0)), ["empty"]),
    ("umn-fluid-shape", "umn", "umn", edit_mat("UMNDataset.mat", umn_fluid_shape), ["shape"]),
    ("umn-out-of-range", "umn", "umn", edit_mat("UMNDataset.mat", umn_out_of_range),
     ["0–255"]),
    ("umn-garbled", "umn", "umn", garble("UMNDataset.mat"), ["not a readable MATLAB"]),
    # COVID-19 CT: seg as above
    ("medseg-empty-split", "covidct", "covidct", medseg_keep(2), ["train split", "empty"]),
    ("medseg-no-slices", "covidct", "covidct", medseg_keep(0), ["3-D"]),
    ("medseg-nan-hu", "covidct", "covidct",
     edit_nifti("tr_im.nii.gz", with_value(np.nan)), ["NaN"]),
    ("medseg-label-5", "covidct", "covidct",
     edit_nifti("tr_mask.nii.gz", with_value(5.0)), ["mask values", "5"]),
    ("medseg-shape", "covidct", "covidct",
     edit_nifti("tr_mask.nii.gz", lambda a: a[:-1]), ["shape"]),
    ("medseg-missing-mask", "covidct", "covidct", remove("tr_mask.nii.gz"), ["missing"]),
    ("medseg-truncated", "covidct", "covidct", truncate("tr_im.nii.gz"), ["corrupt"]),
    ("infnet-empty-split", "infnet", "covidct", infnet_keep_two, ["train split", "empty"]),
    ("infnet-truth-values", "infnet", "covidct", infnet_gray_truth, ["ground-truth values"]),
    ("infnet-image-without-truth", "infnet", "covidct",
     remove("GT/slice3.png", "Imgs/slice3.png"), ["no matching ground truth"]),
    # FeTS: every collaborator trains on its train and validates on its val subjects
    ("fets-empty-split", "fets", "fets", fets_lone_subject, ["partition 999", "empty"]),
    ("fets-label-3", "fets", "fets", fets_file("seg", with_value(3.0)), ["outside"]),
    ("fets-nan-flair", "fets", "fets", fets_file("flair", with_value(np.nan)), ["NaN"]),
    ("fets-shape", "fets", "fets", fets_file("t2", lambda a: a[:-1]), ["shape"]),
    ("fets-missing-modality", "fets", "fets", fets_remove("t1ce"), ["missing"]),
    ("fets-truncated", "fets", "fets", fets_truncate, ["corrupt"]),
    ("fets-csv-header", "fets", "fets", fets_header, ["header"]),
    ("fets-missing-folder", "fets", "fets", fets_missing_folder, ["does not exist"]),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "dataset", "spoil", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_raw_file_is_named_and_nothing_is_written(
    clean: dict[str, Path], tmp_path: Path, kind: str, dataset: str,
    spoil: Callable[[Path], str], words: list[str],
) -> None:  # fmt: skip
    raw = Path(shutil.copytree(clean[kind], tmp_path / "raw"))
    bad = (raw / spoil(raw)).resolve()
    processed = tmp_path / "processed"
    with pytest.raises(DataFormatError) as err:
        stage.preprocess(dataset, CFG[dataset], raw, processed / dataset)
    assert Path(err.value.path).resolve() == bad, err.value
    for word in words:
        assert word in err.value.problem, err.value
    assert not processed.exists() or list(processed.iterdir()) == []
