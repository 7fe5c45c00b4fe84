"""Synthetic FeTS 2022: brain-tumour MRI written in the real FeTS raw layout.

Layout written directly inside `raw_dir` (as in `MICCAI_FeTS2022_TrainingData/`):

    raw_dir/partitioning_2.csv                       header Partition_ID,Subject_ID (33 partitions)
    raw_dir/FeTS2022_XXXXX/FeTS2022_XXXXX_{t1,t1ce,t2,flair}.nii.gz   int16, zero outside brain
    raw_dir/FeTS2022_XXXXX/FeTS2022_XXXXX_seg.nii.gz                  uint8, values {0, 1, 2, 4}

Subject ids are 5-digit zero-padded, numbered 1..N in partition order. Partition sizes are the 33
real partitioning-2 sizes times `cfg["synthetic"]["subjects_scale"]`, rounded half up, each at
least 2 (so every institution keeps one train and one validation subject).

Learnable structure: an ellipsoidal brain with a smooth grey/white-matter texture and a bias
field, and a deformed ellipsoidal tumour with nested regions - oedema (2) outside, enhancing rim
(4), necrotic core (1) inside; 20 % of subjects have no necrotic core (solid enhancing core) and
10 % no enhancement (non-enhancing core labelled 1). Modality contrasts follow BraTS: T1 tumour
hypointense, T1ce bright enhancing rim and dark core, T2 oedema and core bright, FLAIR oedema
bright and core intermediate. Institutions are non-IID: each partition draws its own per-modality
intensity scale and offset, a contrast exponent (gamma) and a noise level.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpmed.data.nifti import write_nifti
from dpmed.errors import ConfigError
from dpmed.io import atomic_dir, write_text

# Real partitioning_2.csv sizes of partitions 1..33 (1251 subjects).
REAL_PARTITION_SIZES: tuple[int, ...] = (
    170, 170, 171, 6, 15, 16, 15, 16, 22, 34, 12, 8, 4, 8, 14, 11, 12,
    11, 12, 6, 13, 30, 9, 127, 127, 128, 4, 33, 12, 11, 12, 7, 5,
)  # fmt: skip
MODALITIES: tuple[str, ...] = ("t1", "t1ce", "t2", "flair")

# Relative signal of each tissue class per modality, columns: GM, WM, ED, ET, NCR.
_SIGNAL = np.array(
    [
        [0.75, 1.00, 0.60, 0.65, 0.35],  # t1: tumour hypointense
        [0.70, 0.90, 0.65, 1.60, 0.30],  # t1ce: enhancing rim bright, necrotic core dark
        [0.80, 0.60, 1.30, 1.10, 1.50],  # t2: oedema and core bright
        [0.80, 0.65, 1.50, 1.20, 0.90],  # flair: oedema bright, core intermediate
    ],
    dtype=np.float32,
)
_EDGE = 0.04  # width of the soft tumour boundaries, in normalised tumour radii


def partition_sizes(subjects_scale: float) -> list[int]:
    """Sizes of the 33 synthetic partitions: real sizes × scale, rounded half up, at least 2."""
    return [max(2, int(np.floor(n * subjects_scale + 0.5))) for n in REAL_PARTITION_SIZES]


def subject_id(number: int) -> str:
    """FeTS subject id of subject `number` (e.g. 7 → 'FeTS2022_00007')."""
    return f"FeTS2022_{number:05d}"


def generate(raw_dir: Path, dataset: str, cfg: dict, seed: int) -> None:
    """Write a synthetic FeTS 2022 training set into `raw_dir` (replaced atomically).

    `cfg` is the dataset config block; `cfg["synthetic"]` gives `shape` (X, Y, Z voxels) and
    `subjects_scale`. The same `seed` gives byte-identical files.
    """
    shape = tuple(int(s) for s in cfg["synthetic"]["shape"])
    if len(shape) != 3 or min(shape) < 8:
        raise ConfigError(
            f"data.{dataset}.synthetic.shape", f"need 3 sizes >= 8, got {list(shape)}"
        )
    sizes = partition_sizes(float(cfg["synthetic"]["subjects_scale"]))
    rng = np.random.default_rng(seed)
    sites = _draw_sites(rng, len(sizes))
    rows = ["Partition_ID,Subject_ID"]
    with atomic_dir(raw_dir) as tmp:
        number = 0
        for part, size in enumerate(sizes):
            for _ in range(size):
                number += 1
                sid = subject_id(number)
                rows.append(f"{part + 1},{sid}")
                images, seg = _subject(rng, shape, {k: v[part] for k, v in sites.items()})
                folder = tmp / sid
                folder.mkdir()
                for name, image in zip(MODALITIES, images, strict=True):
                    write_nifti(folder / f"{sid}_{name}.nii.gz", image)
                write_nifti(folder / f"{sid}_seg.nii.gz", seg)
        write_text(tmp / cfg.get("partitioning", "partitioning_2.csv"), "\n".join(rows) + "\n")


def _draw_sites(rng: np.random.Generator, n_sites: int) -> dict[str, np.ndarray]:
    """Per-institution acquisition parameters: per-modality scale and offset (int16 units),
    contrast exponent gamma and relative noise level."""
    return {
        "scale": rng.uniform(300.0, 1500.0, (n_sites, len(MODALITIES))),
        "offset": rng.uniform(0.0, 200.0, (n_sites, len(MODALITIES))),
        "gamma": rng.uniform(0.7, 1.4, n_sites),
        "noise": rng.uniform(0.01, 0.06, n_sites),
    }


def _smooth_field(rng: np.random.Generator, axes: list[np.ndarray], n_comp: int = 4) -> np.ndarray:
    """Smooth random 3D field in [-1, 1] on the grid spanned by `axes` (normalised coordinates,
    about [-1, 1] across the brain): a sum of separable cosine products, 0.5-2.5 cycles/unit."""
    field = np.zeros([len(a) for a in axes], dtype=np.float32)
    amps = rng.uniform(0.5, 1.0, n_comp)
    for amp in amps:
        freq = rng.uniform(0.5, 2.5, 3) * np.pi
        phase = rng.uniform(0.0, 2 * np.pi, 3)
        cx, cy, cz = (
            np.cos(f * a + p).astype(np.float32) for f, a, p in zip(freq, axes, phase, strict=True)
        )
        field += np.float32(amp) * cx[:, None, None] * cy[None, :, None] * cz[None, None, :]
    return field / np.float32(amps.sum())


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def _subject(
    rng: np.random.Generator, shape: tuple[int, int, int], site: dict[str, np.ndarray]
) -> tuple[list[np.ndarray], np.ndarray]:
    """One subject: four int16 modality volumes (zero outside the brain) and the uint8 seg."""
    centre = np.array(shape) / 2.0 + rng.uniform(-0.03, 0.03, 3) * np.array(shape)
    radii = np.array(shape) * rng.uniform(0.36, 0.44, 3)
    axes = [(np.arange(n) - c) / r for n, c, r in zip(shape, centre, radii, strict=True)]
    brain = (axes[0][:, None, None] ** 2 + axes[1][None, :, None] ** 2
             + axes[2][None, None, :] ** 2) <= 1.0  # fmt: skip
    white = _sigmoid(4.0 * _smooth_field(rng, axes))
    bias = 1.0 + 0.08 * _smooth_field(rng, axes, n_comp=2)
    regions = _tumour(rng, shape, centre, radii)
    seg = np.zeros(shape, dtype=np.uint8)
    box, label, soft = regions
    seg[box] = label * brain[box]
    signal = _SIGNAL
    images = []
    for m in range(len(MODALITIES)):
        tissue = signal[m, 0] + (signal[m, 1] - signal[m, 0]) * white
        sub = tissue[box]  # a view: blending the tumour in writes into `tissue`
        for col, weight in zip((2, 3, 4), soft, strict=True):
            sub += (signal[m, col] - sub) * weight
        scale = np.float32(site["scale"][m])
        value = np.power(tissue * bias, np.float32(site["gamma"])) * scale
        value += np.float32(site["offset"][m])
        value += rng.standard_normal(shape, dtype=np.float32) * (np.float32(site["noise"]) * scale)
        image = np.where(brain, np.clip(np.rint(value), 1, np.iinfo(np.int16).max), 0)
        images.append(image.astype(np.int16))
    return images, seg


def _tumour(
    rng: np.random.Generator, shape: tuple[int, int, int], brain_c: np.ndarray, brain_r: np.ndarray
) -> tuple[tuple[slice, ...], np.ndarray, list[np.ndarray]]:
    """Tumour inside the brain, computed on its bounding box only.

    Returns the box (slices), the hard labels there (0/1/2/4) and the soft weights of the
    oedema, enhancing and necrotic regions used to blend intensities.
    """
    direction = rng.normal(size=3)
    direction /= np.linalg.norm(direction)
    centre = brain_c + direction * rng.uniform(0.0, 0.45) * brain_r
    radii = brain_r * rng.uniform(0.2, 0.35, 3)
    reach = np.ceil(radii * 1.3).astype(int) + 1
    lo = np.maximum(np.floor(centre).astype(int) - reach, 0)
    hi = np.minimum(np.floor(centre).astype(int) + reach + 1, shape)
    box = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))
    axes = [(np.arange(a, b) - c) / r for a, b, c, r in zip(lo, hi, centre, radii, strict=True)]
    dist = np.sqrt(axes[0][:, None, None] ** 2 + axes[1][None, :, None] ** 2
                   + axes[2][None, None, :] ** 2)  # fmt: skip
    dist *= 1.0 + 0.2 * _smooth_field(rng, axes, n_comp=3)
    et_edge = rng.uniform(0.45, 0.65)
    ncr_edge = rng.uniform(0.2, 0.35) * et_edge / 0.55
    kind = rng.choice(3, p=[0.7, 0.2, 0.1])  # full / no necrotic core / no enhancement
    if kind == 1:
        ncr_edge = 0.0
    label = np.where(dist < 1.0, 2, 0).astype(np.uint8)
    if kind == 2:
        label[dist < et_edge] = 1
        ncr_edge, et_edge = et_edge, 0.0
    else:
        label[dist < et_edge] = 4
        label[dist < ncr_edge] = 1
    soft = [_sigmoid((edge - dist) / _EDGE) if edge > 0 else np.zeros_like(dist)
            for edge in (1.0, et_edge, ncr_edge)]  # fmt: skip
    return box, label, soft
