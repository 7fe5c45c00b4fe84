"""Synthetic DME OCT volumes written in the public Duke and UMN MATLAB layouts.

One retina generator serves both datasets. Each subject is a volume of B-scans (H rows × W
A-scan columns × B B-scans) with 8 smooth, wavy layer boundaries in Chiu et al.'s order
(ILM, RNFL/GCL, IPL/INL, INL/OPL, OPL/ONL, ISM/ISE, OS/RPE, RPE/choroid), anchored on a tilted,
curved RPE. Layer thicknesses follow the real relative proportions (ONL thickest, a thin OPL),
the inner layers thin out in a foveal pit, and intensities mimic OCT reflectivity (bright RNFL,
ellipsoid zone and RPE bands, dark INL/ONL, dark vitreous, a fading choroid) under multiplicative
gamma speckle. Diabetic macular oedema is modelled as 3-D ellipsoidal fluid pockets inside the
INL or ONL: each swells its layer (pushing the inner retina up) and is rendered almost black, so
fluid is learnable both from intensity and from the bulging layers.

Files written (same seed → byte-identical files; the MAT header timestamp is fixed):

- duke: `Subject_01.mat … Subject_NN.mat` (MATLAB v5, compressed), each with `images`
  (H×W×B uint8), `manualLayers1`/`manualLayers2` (8×W×B float64, 1-based boundary rows; NaN
  outside the annotated central ~70 % of columns and in non-annotated B-scans; grader 2 is
  grader 1 with small smooth offsets), `manualFluid1`/`manualFluid2` (H×W×B float64: fluid
  pocket ids 1, 2, … in annotated columns, 0 elsewhere in annotated B-scans, NaN in
  non-annotated B-scans; grader 2 draws each pocket slightly taller or flatter).
  `n_annotated` B-scans per subject are annotated, evenly spread over the volume.
- umn: `UMNDataset.mat` with 1×n cell arrays `AllSubjects` (H×W×B uint8 per subject) and
  `ManualFluid1`/`ManualFluid2` (H×W×B uint8, 1 = fluid). Every B-scan is annotated; pockets
  stay in the central B-scans so the first and last B-scans of each volume have no fluid.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.io
from scipy import ndimage, special

from dpmed.errors import ConfigError
from dpmed.io import atomic_dir

# Thickness of the 7 regions between the 8 boundaries, as a fraction of the image height
# (≈ 10, 18, 10, 8, 22, 8, 7 px at Spectralis' 496 rows): RNFL, GCL+IPL, INL, OPL, ONL+ISM,
# ISE+OS, RPE.
LAYER_THICKNESS = np.array([0.020, 0.036, 0.020, 0.016, 0.044, 0.016, 0.014])
# Mean reflectivity (0–255) of vitreous, the 7 layers and the top of the choroid.
REGION_INTENSITY = np.array([12.0, 185.0, 110.0, 60.0, 125.0, 48.0, 165.0, 215.0, 100.0])
FLUID_INTENSITY = 10.0
FLUID_LAYERS = (3, 5)  # oedema sits in the INL or the ONL (region indices, 1-based layers)
MAT_DESCRIPTION = b"MATLAB 5.0 MAT-file, Platform: posix, Created by: dpmed synthetic generator"


@dataclass(frozen=True)
class Pocket:
    """A 3-D ellipsoidal fluid pocket: region `layer`, centred at column `col` (px) and B-scan
    `bscan`; semi-axes `half_width` (px) and `half_depth` (B-scans); `swell` (px) is the layer
    thickening at its centre; `grader2_scale` rescales its height for grader 2."""

    layer: int
    col: float
    bscan: float
    half_width: float
    half_depth: float
    swell: float
    grader2_scale: float


@dataclass(frozen=True)
class Anatomy:
    """Per-subject shape parameters (pixels unless stated)."""

    rpe_row: float  # 1-based row of the RPE/choroid boundary at the centre
    tilt: float  # row change from the left to the right edge
    curvature: float  # how much higher the edges are than the centre
    wave_amp: np.ndarray  # (2,) amplitudes of the boundary undulations
    wave_freq: np.ndarray  # (2,) cycles per image width
    wave_phase: np.ndarray  # (2,) radians
    thickness: np.ndarray  # (7,) layer thicknesses
    nasal_side: float  # +1 / -1: side where the RNFL is thicker
    fovea_col: float
    fovea_bscan: float
    fovea_sigma_col: float
    fovea_sigma_bscan: float
    gain: float  # overall brightness factor
    pockets: tuple[Pocket, ...]


def generate(raw_dir: Path, dataset: str, cfg: dict, seed: int) -> None:
    """Write the synthetic raw files of `dataset` ("duke" or "umn") into `raw_dir`.

    Sizes come from cfg["synthetic"]: shape [H, W], n_subjects, n_bscans (and n_annotated for
    duke); the optional `fluid_scale` (default 1) multiplies every fluid pocket's width and
    height (`_pocket`). The folder is replaced atomically. Same seed → byte-identical files.
    """
    syn = cfg["synthetic"]
    height, width = (int(v) for v in syn["shape"])
    n_subjects, n_bscans = int(syn["n_subjects"]), int(syn["n_bscans"])
    fluid_scale = float(syn.get("fluid_scale", 1.0))
    rng = np.random.default_rng(seed)
    with atomic_dir(raw_dir) as tmp:
        if dataset == "duke":
            n_annotated = int(syn["n_annotated"])
            if not 1 <= n_annotated <= n_bscans:
                raise ConfigError(
                    "data.duke.synthetic.n_annotated", f"must be in 1..n_bscans ({n_bscans})"
                )
            for index in range(1, n_subjects + 1):
                variables = _duke_subject(rng, height, width, n_bscans, n_annotated, fluid_scale)
                _savemat(tmp / f"Subject_{index:02d}.mat", variables)
        elif dataset == "umn":
            umn = _umn_dataset(rng, height, width, n_bscans, n_subjects, fluid_scale)
            _savemat(tmp / "UMNDataset.mat", umn)
        else:
            raise ValueError(f"the OCT generator makes 'duke' or 'umn', not '{dataset}'")


def _savemat(path: Path, variables: dict[str, np.ndarray]) -> None:
    """Save MATLAB v5 (compressed) and fix the header text, which scipy stamps with the time."""
    scipy.io.savemat(path, variables, do_compression=True)
    with open(path, "r+b") as fh:
        fh.write(MAT_DESCRIPTION.ljust(116))


def _duke_subject(
    rng: np.random.Generator,
    height: int,
    width: int,
    n_bscans: int,
    n_annotated: int,
    fluid_scale: float = 1.0,
) -> dict[str, np.ndarray]:
    """One Duke subject: the volume plus NaN-masked annotations of `n_annotated` B-scans."""
    images, boundaries, fluid1, fluid2 = retina_volume(rng, height, width, n_bscans, fluid_scale)
    annotated = [(2 * i + 1) * n_bscans // (2 * n_annotated) for i in range(n_annotated)]
    layers1 = np.full((8, width, n_bscans), np.nan)
    layers2 = np.full((8, width, n_bscans), np.nan)
    manual1 = np.full((height, width, n_bscans), np.nan)
    manual2 = np.full((height, width, n_bscans), np.nan)
    jitter = max(1, round(0.02 * width))
    span = max(1, round(0.7 * width))
    for b in annotated:
        start = round(0.15 * width) + int(rng.integers(-jitter, jitter + 1))
        start = min(max(0, start), width - span)
        cols = slice(start, start + span)
        layers1[:, cols, b] = np.round(boundaries[:, cols, b])
        layers2[:, cols, b] = np.round(boundaries[:, cols, b] + _grader_offset(rng, width)[:, cols])
        manual1[:, :, b] = 0.0
        manual2[:, :, b] = 0.0
        manual1[:, cols, b] = fluid1[:, cols, b]
        manual2[:, cols, b] = fluid2[:, cols, b]
    return {
        "images": images,
        "manualLayers1": layers1,
        "manualLayers2": layers2,
        "manualFluid1": manual1,
        "manualFluid2": manual2,
    }


def _grader_offset(rng: np.random.Generator, width: int) -> np.ndarray:
    """(8, W) smooth disagreement of grader 2 with grader 1 (about ±1 px)."""
    x = np.arange(width) / width
    offset = rng.normal(0.0, 0.4, size=(8, 1))
    phase = rng.uniform(0, 2 * np.pi, size=(8, 1))
    return offset + 0.6 * np.sin(2 * np.pi * 1.5 * x[None, :] + phase)


def _umn_dataset(
    rng: np.random.Generator,
    height: int,
    width: int,
    n_bscans: int,
    n_subjects: int,
    fluid_scale: float = 1.0,
) -> dict[str, np.ndarray]:
    """UMN layout: 1×n cell arrays (numpy object arrays) of volumes and binary fluid masks."""
    cells = {
        name: np.empty((1, n_subjects), dtype=object)
        for name in ("AllSubjects", "ManualFluid1", "ManualFluid2")
    }
    for i in range(n_subjects):
        images, _, fluid1, fluid2 = retina_volume(rng, height, width, n_bscans, fluid_scale)
        cells["AllSubjects"][0, i] = images
        cells["ManualFluid1"][0, i] = (fluid1 > 0).astype(np.uint8)
        cells["ManualFluid2"][0, i] = (fluid2 > 0).astype(np.uint8)
    return cells


def retina_volume(
    rng: np.random.Generator, height: int, width: int, n_bscans: int, fluid_scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate one subject's volume (`fluid_scale` multiplies each pocket's width and height).

    Returns images (H, W, B) uint8, boundaries (8, W, B) float64 (1-based rows, exact
    geometry), and fluid pocket ids of grader 1 and grader 2 (H, W, B) uint8 (0 = no fluid).
    """
    anatomy = _anatomy(rng, height, width, n_bscans, fluid_scale)
    images = np.empty((height, width, n_bscans), dtype=np.uint8)
    boundaries = np.empty((8, width, n_bscans))
    fluid1 = np.zeros((height, width, n_bscans), dtype=np.uint8)
    fluid2 = np.zeros_like(fluid1)
    for b in range(n_bscans):
        bnd, extents = _bscan_geometry(anatomy, b, height, width)
        boundaries[:, :, b] = bnd
        fluid1[:, :, b] = _fluid_ids(extents, height, width, grader2=False)
        fluid2[:, :, b] = _fluid_ids(extents, height, width, grader2=True)
        images[:, :, b] = _render(rng, anatomy, bnd, fluid1[:, :, b] > 0)
    return images, boundaries, fluid1, fluid2


def _anatomy(
    rng: np.random.Generator, height: int, width: int, n_bscans: int, fluid_scale: float = 1.0
) -> Anatomy:
    """Draw one subject's anatomy (retina position, undulations, fovea, fluid pockets)."""
    pockets = tuple(
        _pocket(rng, height, width, n_bscans, fluid_scale) for _ in range(int(rng.integers(1, 6)))
    )
    return Anatomy(
        rpe_row=rng.uniform(0.58, 0.66) * height,
        tilt=rng.uniform(-0.05, 0.05) * height,
        curvature=rng.uniform(0.0, 0.05) * height,
        wave_amp=rng.uniform(0.002, 0.008, size=2) * height,
        wave_freq=rng.uniform(0.5, 2.5, size=2),
        wave_phase=rng.uniform(0, 2 * np.pi, size=2),
        thickness=LAYER_THICKNESS * height * rng.uniform(0.9, 1.1, size=7),
        nasal_side=float(rng.choice([-1.0, 1.0])),
        fovea_col=rng.uniform(0.45, 0.55) * width,
        fovea_bscan=rng.uniform(0.45, 0.55) * (n_bscans - 1),
        fovea_sigma_col=rng.uniform(0.06, 0.09) * width,
        fovea_sigma_bscan=max(0.5, 0.08 * n_bscans),
        gain=rng.uniform(0.85, 1.1),
        pockets=pockets,
    )


def _pocket(
    rng: np.random.Generator, height: int, width: int, n_bscans: int, fluid_scale: float = 1.0
) -> Pocket:
    """Draw one fluid pocket in the central columns and B-scans. Its slow-axis half-depth stays
    below the distance to the first and last B-scan, so (for B ≥ 3) those are fluid-free.
    `fluid_scale` multiplies the drawn half-width and swell (the draws themselves do not change,
    so scale 1 gives the same pockets): at a coarse training size, e.g. 32×32, the default
    pockets are 1–2 px tall, and a scale of 2–3 makes them a few pixels wide and tall."""
    centre = rng.uniform(0.3, 0.7) * (n_bscans - 1)
    room = min(centre, n_bscans - 1 - centre)
    return Pocket(
        layer=int(rng.choice(FLUID_LAYERS, p=[0.4, 0.6])),
        col=rng.uniform(0.25, 0.75) * width,
        bscan=centre,
        half_width=rng.uniform(0.03, 0.08) * width * fluid_scale,
        half_depth=max(0.6, rng.uniform(0.6, 0.95) * room),
        swell=rng.uniform(0.02, 0.06) * height * fluid_scale,
        grader2_scale=rng.uniform(0.85, 1.15),
    )


def _bscan_geometry(
    anatomy: Anatomy, b: int, height: int, width: int
) -> tuple[np.ndarray, list[tuple[Pocket, np.ndarray, np.ndarray]]]:
    """Boundaries (8, W) of B-scan `b` and, per pocket cut by it, (pocket, fluid height (W,),
    fluid centre row (W,)). Boundaries are built bottom-up from the RPE, so fluid swelling a
    layer lifts every boundary above it, as oedema does."""
    u = 2.0 * np.arange(width) / max(width - 1, 1) - 1.0  # −1 … 1 across the scan
    x = np.arange(width) / width
    slow = 0.05 * b  # phase drift: the undulations change slowly from B-scan to B-scan
    rpe = anatomy.rpe_row + 0.5 * anatomy.tilt * u - anatomy.curvature * u**2
    for amp, freq, phase in zip(
        anatomy.wave_amp, anatomy.wave_freq, anatomy.wave_phase, strict=True
    ):
        rpe = rpe + amp * np.sin(2 * np.pi * freq * x + phase + slow)
    pit = np.exp(
        -(((np.arange(width) - anatomy.fovea_col) / anatomy.fovea_sigma_col) ** 2)
        - ((b - anatomy.fovea_bscan) / anatomy.fovea_sigma_bscan) ** 2
    )
    thickness = np.repeat(anatomy.thickness[:, None], width, axis=1)
    thickness[0] *= np.clip(1.0 + 0.5 * anatomy.nasal_side * u, 0.4, None)
    thickness[:4] *= 1.0 - 0.9 * pit
    thickness[4] *= 1.0 + 0.35 * pit
    extents = []
    for pocket in anatomy.pockets:
        cut = 1.0 - ((b - pocket.bscan) / pocket.half_depth) ** 2
        if cut <= 0:
            continue
        half_width = pocket.half_width * np.sqrt(cut)
        lateral = np.clip(1.0 - ((np.arange(width) - pocket.col) / half_width) ** 2, 0.0, None)
        fluid_height = pocket.swell * np.sqrt(cut) * np.sqrt(lateral)
        thickness[pocket.layer - 1] += fluid_height
        extents.append((pocket, fluid_height))
    boundaries = np.empty((8, width))
    boundaries[7] = rpe
    for k in range(6, -1, -1):
        boundaries[k] = boundaries[k + 1] - thickness[k]
    located = [
        (pocket, fh, 0.5 * (boundaries[pocket.layer - 1] + boundaries[pocket.layer]))
        for pocket, fh in extents
    ]
    return boundaries, located


def _fluid_ids(
    extents: list[tuple[Pocket, np.ndarray, np.ndarray]], height: int, width: int, grader2: bool
) -> np.ndarray:
    """(H, W) pocket ids 1, 2, … (in pocket order) of one B-scan; 0 = no fluid. A pixel (1-based
    row y+1) is fluid when it lies within half the pocket's height of the layer's mid-line."""
    rows = np.arange(1, height + 1, dtype=float)[:, None]
    ids = np.zeros((height, width), dtype=np.uint8)
    for number, (pocket, fluid_height, centre) in enumerate(extents, start=1):
        half = 0.5 * fluid_height * (pocket.grader2_scale if grader2 else 1.0)
        inside = (np.abs(rows - centre[None, :]) <= half[None, :]) & (half[None, :] >= 0.5)
        ids[inside] = number
    return ids


def _render(
    rng: np.random.Generator, anatomy: Anatomy, boundaries: np.ndarray, fluid: np.ndarray
) -> np.ndarray:
    """(H, W) uint8 OCT B-scan: a smooth reflectivity profile stepping at each boundary, a
    choroid fading with depth, dark fluid, gamma speckle and a slight blur."""
    height, width = fluid.shape
    rows = np.arange(1, height + 1, dtype=float)[:, None, None]
    steps = special.expit((rows - boundaries.T[None, :, :]) / 0.4)  # (H, W, 8)
    levels = REGION_INTENSITY.copy()
    profile = levels[0] + steps[:, :, :7] @ np.diff(levels[:8])
    depth = np.clip(rows[:, :, 0] - boundaries[7][None, :], 0.0, None)
    choroid = 20.0 + (levels[8] - 20.0) * np.exp(-depth / (0.06 * height))
    profile = profile + (choroid - levels[7]) * steps[:, :, 7]
    u = 2.0 * np.arange(width) / max(width - 1, 1) - 1.0
    profile = profile * anatomy.gain * (1.0 - 0.15 * u**2)[None, :]
    profile = np.where(fluid, FLUID_INTENSITY, profile)
    speckled = profile * rng.gamma(4.0, 0.25, size=profile.shape)
    speckled = ndimage.gaussian_filter(speckled, sigma=(0.7, 0.9))
    speckled = speckled + rng.normal(0.0, 4.0, size=speckled.shape)
    return np.clip(np.round(speckled), 0, 255).astype(np.uint8)
