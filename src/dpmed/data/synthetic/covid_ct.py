"""Synthetic COVID-19 CT in the MedSeg release layout: `tr_im.nii.gz` + `tr_mask.nii.gz`.

`tr_im.nii.gz`: H×W×N float32 axial slices in Hounsfield units (integer-valued, as scanners
deliver), nibabel axis order (rows, columns, slices). `tr_mask.nii.gz`: H×W×N uint8 labels
0 background, 1 ground-glass, 2 consolidation, 3 pleural effusion.

Learnable structure per slice (row index grows towards posterior):
- air outside the body (−1000 HU); a body ellipse of soft tissue (≈40 HU) with a subcutaneous
  fat layer (≈−100 HU), a rib-like bright rim and a spine-like bright disc (bone, ≈500–700 HU);
- two lungs (≈−850 HU) with a vessel texture (small bright dots from a smoothed noise field);
  lung size shrinks towards the apex and base of the volume;
- infections only inside the lungs: hazy ground-glass blobs (≈−500 HU, vessels still visible)
  and denser consolidations (−50…+40 HU), with irregular edges; a posterior crescent of pleural
  effusion (≈+15 HU) in some infected slices; about a quarter of the slices have no lesion;
- Gaussian noise (σ ≈ 15 HU) everywhere.
Everything is vectorised over slices; the only randomness is `np.random.default_rng(seed)`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import ndimage

from dpmed.data.nifti import write_nifti
from dpmed.io import atomic_dir

AIR_HU = -1000.0
FAT_HU = -100.0
TISSUE_HU = 40.0
BONE_HU = 600.0
LUNG_HU = -850.0
GGO_HU = -500.0
EFFUSION_HU = 15.0
NOISE_HU = 15.0
MAX_BLOBS = 4


def generate(raw_dir: Path, dataset: str, cfg: dict, seed: int) -> None:
    """Write `tr_im.nii.gz` and `tr_mask.nii.gz` into `raw_dir` (replaced atomically).

    Sizes come from `cfg["synthetic"]`: `shape` = [H, W], `n_slices` = N; the optional
    `lesion_scale` (default 1) multiplies the lesion size (`synthesize`). `dataset` is the
    dataset name ("covidct"); it does not change the content. Same seed → identical bytes.
    """
    syn = cfg["synthetic"]
    height, width = (int(v) for v in syn["shape"])
    scale = float(syn.get("lesion_scale", 1.0))
    hu, labels, _ = synthesize((height, width), int(syn["n_slices"]), seed, lesion_scale=scale)
    with atomic_dir(raw_dir) as tmp:
        write_nifti(tmp / "tr_im.nii.gz", hu)
        write_nifti(tmp / "tr_mask.nii.gz", labels)


def synthesize(
    shape: tuple[int, int], n_slices: int, seed: int, lesion_scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw one synthetic CT volume. `lesion_scale` multiplies every blob's drawn size (0.2–0.45
    of its lung's semi-axes; the draws do not change, so scale 1 gives the same volume): at a
    coarse training size, e.g. 32×32, the default blobs are 1–3 px across.

    Returns `(hu, labels, lungs)`, each H×W×N: `hu` float32 Hounsfield units (integers),
    `labels` uint8 in {0, 1, 2, 3}, `lungs` bool lung mask (every label 1–3 lies inside it).
    """
    rng = np.random.default_rng(seed)
    height, width = shape
    yy = np.linspace(-1.0, 1.0, height, dtype=np.float32)[None, :, None]
    xx = np.linspace(-1.0, 1.0, width, dtype=np.float32)[None, None, :]
    sigma = max(0.8, height / 256.0)
    texture = _smooth_field(rng, (n_slices, height, width), sigma)
    coarse = _plane_waves(rng, yy, xx, n_slices)

    hu, body_radius = _thorax(rng, yy, xx, n_slices)
    lungs, lung_geometry = _lungs(rng, yy, xx, n_slices, body_radius)
    vessels = np.clip(texture - 1.6, 0.0, None) * 500.0
    hu = np.where(lungs, LUNG_HU + 20.0 * texture + vessels, hu)

    labels = np.zeros((n_slices, height, width), dtype=np.uint8)
    infected = _infected_slices(rng, n_slices)
    _add_lesions(
        rng, hu, labels, lungs, lung_geometry, infected, yy, xx, texture, coarse, lesion_scale
    )
    hu = _add_effusion(rng, hu, labels, lungs, lung_geometry, infected, yy, xx)

    hu = hu + NOISE_HU * rng.standard_normal(hu.shape, dtype=np.float32)
    hu = np.clip(np.round(hu), -1024.0, 3071.0).astype(np.float32)
    return _to_hwn(hu), _to_hwn(labels), _to_hwn(lungs)


def _to_hwn(volume: np.ndarray) -> np.ndarray:
    """(N, H, W) working layout → (H, W, N) nibabel layout, C-contiguous."""
    return np.ascontiguousarray(volume.transpose(1, 2, 0))


def _col(values: np.ndarray) -> np.ndarray:
    """Per-slice values (N,) → (N, 1, 1) for broadcasting against (N, H, W)."""
    return np.asarray(values, dtype=np.float32)[:, None, None]


def _smooth_field(
    rng: np.random.Generator, shape: tuple[int, int, int], sigma: float
) -> np.ndarray:
    """Gaussian noise smoothed in-plane by `sigma` pixels and rescaled to unit std (float32)."""
    field = ndimage.gaussian_filter(
        rng.standard_normal(shape, dtype=np.float32), sigma=(0.0, sigma, sigma), mode="wrap"
    )
    return (field / max(float(field.std()), 1e-6)).astype(np.float32)


def _plane_waves(rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray, n: int) -> np.ndarray:
    """Low-frequency field (N, H, W), unit std: three random plane waves of 6–12 cycles across
    the image per slice. Makes lesion outlines irregular at a fraction of a wide blur's cost."""
    field = np.zeros((n, yy.shape[1], xx.shape[2]), dtype=np.float32)
    for _ in range(3):
        freq = _col(rng.uniform(6.0, 12.0, n) * np.pi)
        angle = rng.uniform(0.0, np.pi, n)
        phase = _col(rng.uniform(0.0, 2.0 * np.pi, n))
        field += np.sin(freq * (_col(np.sin(angle)) * yy + _col(np.cos(angle)) * xx) + phase)
    return field * np.float32(np.sqrt(2.0 / 3.0))


def _thorax(
    rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Air, body ellipse, fat layer, rib-like rim and spine. Returns (hu, body radius), both
    (N, H, W); the body radius is 1 on the body outline and < 1 inside."""
    semi_y = _col(0.72 + 0.02 * rng.standard_normal(n).clip(-2, 2))
    semi_x = _col(0.90 + 0.02 * rng.standard_normal(n).clip(-2, 2))
    radius = np.sqrt((yy / semi_y) ** 2 + (xx / semi_x) ** 2)
    angle = np.arctan2(yy / semi_y, xx / semi_x)
    rib_phase = _col(rng.uniform(0.0, 2.0 * np.pi, n))
    ribs = (np.cos(14.0 * angle + rib_phase) > 0.3) & (radius > 0.86) & (radius < 0.93)
    spine = ((yy - 0.58 * semi_y) / 0.11) ** 2 + (xx / 0.09) ** 2 < 1.0
    hu = np.full(radius.shape, AIR_HU, dtype=np.float32)
    hu = np.where(radius < 1.0, TISSUE_HU, hu)
    hu = np.where((radius >= 0.94) & (radius < 1.0), FAT_HU, hu)
    hu = np.where(ribs | spine, BONE_HU, hu)
    return hu.astype(np.float32), radius


def _lungs(
    rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray, n: int, body_radius: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Two lung ellipses per slice, smaller towards the volume's ends, kept inside the rim.

    Returns the lung mask (N, H, W) and each lung's geometry: arrays (2, N) of centre row `cy`,
    centre column `cx` and semi-axes `ry`, `rx` (normalised coordinates in [−1, 1]).
    """
    depth = (np.arange(n) + 0.5) / n
    scale = 0.6 + 0.4 * np.sin(np.pi * depth)
    cy = -0.02 + 0.02 * rng.standard_normal((2, n)).clip(-2, 2)
    offset = 0.42 + 0.02 * rng.standard_normal((2, n)).clip(-2, 2)
    cx = np.stack([-offset[0], offset[1]])
    ry = 0.45 * scale * (1.0 + 0.05 * rng.standard_normal((2, n)).clip(-2, 2))
    rx = 0.27 * (0.7 + 0.3 * scale) * (1.0 + 0.05 * rng.standard_normal((2, n)).clip(-2, 2))
    geometry = {"cy": cy, "cx": cx, "ry": ry, "rx": rx}
    lungs = np.zeros(body_radius.shape, dtype=bool)
    for side in range(2):
        lungs |= _ellipse_distance(yy, xx, geometry, side) < 1.0
    return lungs & (body_radius < 0.84), geometry


def _ellipse_distance(
    yy: np.ndarray, xx: np.ndarray, geometry: dict[str, np.ndarray], side: int
) -> np.ndarray:
    """Squared normalised distance to the centre of lung `side` (< 1 inside), (N, H, W)."""
    u = (yy - _col(geometry["cy"][side])) / _col(geometry["ry"][side])
    v = (xx - _col(geometry["cx"][side])) / _col(geometry["rx"][side])
    return u**2 + v**2


def _infected_slices(rng: np.random.Generator, n: int) -> np.ndarray:
    """Boolean (N,): about 75 % of slices carry lesions; at least one is clean when N ≥ 2."""
    n_clean = max(1, int(round(0.25 * n))) if n >= 2 else 0
    infected = np.ones(n, dtype=bool)
    infected[rng.permutation(n)[:n_clean]] = False
    return infected


def _add_lesions(
    rng: np.random.Generator,
    hu: np.ndarray,
    labels: np.ndarray,
    lungs: np.ndarray,
    geometry: dict[str, np.ndarray],
    infected: np.ndarray,
    yy: np.ndarray,
    xx: np.ndarray,
    texture: np.ndarray,
    coarse: np.ndarray,
    lesion_scale: float = 1.0,
) -> None:
    """Paint up to MAX_BLOBS irregular ground-glass / consolidation blobs per infected slice,
    clipped to the lungs, in place: HU into `hu`, labels 1 / 2 into `labels` (2 overrides 1).

    Ground glass is hazy (soft edge, at most 85 % opaque so vessels shine through, ≈−500 HU);
    consolidation is denser (sharper edge, fully opaque, −50…+40 HU)."""
    n = infected.size
    slots = np.arange(n)
    for slot in range(MAX_BLOBS):
        active = infected & ((slot == 0) | (rng.random(n) < 0.5))
        side = rng.integers(0, 2, n)
        rho = 0.75 * np.sqrt(rng.random(n))
        theta = rng.uniform(0.0, 2.0 * np.pi, n)
        lung_ry, lung_rx = geometry["ry"][side, slots], geometry["rx"][side, slots]
        cy = geometry["cy"][side, slots] + rho * lung_ry * np.sin(theta)
        cx = geometry["cx"][side, slots] + rho * lung_rx * np.cos(theta)
        size = rng.uniform(0.2, 0.45, n) * lesion_scale
        cons = rng.random(n) < 0.35
        target = np.where(cons, rng.uniform(-50.0, 40.0, n), GGO_HU)
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            continue
        dist = ((yy - _col(cy[idx])) / _col(size[idx] * lung_ry[idx])) ** 2 + (
            (xx - _col(cx[idx])) / _col(size[idx] * lung_rx[idx])
        ) ** 2
        dist *= 1.0 + 0.4 * coarse[idx]
        inside = (dist < 1.0) & lungs[idx]
        steep, opacity = _col(np.where(cons, 3.0, 2.0)[idx]), _col(np.where(cons, 1.0, 0.85)[idx])
        weight = opacity * np.clip(steep * (1.0 - dist), 0.0, 1.0)
        lesion_hu = _col(target[idx]) + _col(np.where(cons, 15.0, 40.0)[idx]) * texture[idx]
        block = hu[idx]
        hu[idx] = np.where(inside, block + weight * (lesion_hu - block), block)
        block_labels = labels[idx]
        is_cons = _col(cons[idx]) > 0.5
        block_labels[inside & ~is_cons & (block_labels == 0)] = 1
        block_labels[inside & is_cons] = 2
        labels[idx] = block_labels


def _add_effusion(
    rng: np.random.Generator,
    hu: np.ndarray,
    labels: np.ndarray,
    lungs: np.ndarray,
    geometry: dict[str, np.ndarray],
    infected: np.ndarray,
    yy: np.ndarray,
    xx: np.ndarray,
) -> np.ndarray:
    """Pleural effusion (label 3, ≈+15 HU): a crescent along the posterior (high-row) border of
    one lung in about 30 % of the infected slices. Returns new HU; writes into `labels`."""
    n = infected.size
    slots = np.arange(n)
    present = infected & (rng.random(n) < 0.3)
    side = rng.integers(0, 2, n)
    cut = rng.uniform(0.55, 0.8, n)
    u = (yy - _col(geometry["cy"][side, slots])) / _col(geometry["ry"][side, slots])
    v = (xx - _col(geometry["cx"][side, slots])) / _col(geometry["rx"][side, slots])
    crescent = (u**2 + v**2 < 1.0) & (u > _col(cut) + 0.35 * v**2)
    effusion = crescent & lungs & _col(present).astype(bool)
    labels[effusion] = 3
    return np.where(effusion, np.float32(EFFUSION_HU), hu).astype(np.float32)
