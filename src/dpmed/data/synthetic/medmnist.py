"""Synthetic MedMNIST: official npz layout with class-dependent, learnable image content.

Writes `{flag}.npz` (size 28) or `{flag}_{size}.npz` with the official keys `train_images,
train_labels, val_images, val_labels, test_images, test_labels`; images uint8 (N, H, W) for
PneumoniaMNIST and (N, H, W, 3) for the RGB flags, labels uint8 (N, 1).

Class balance (`synthetic.class_balance`): `official` (default) gives, per split, one image
per class first (when the split has at least n_classes images), the rest by largest remainder on
the official TRAIN class frequencies; `uniform` gives every class n // n_classes images and one
more to the lowest class indices, so class counts differ by at most 1 (a small demo split where
the rare official classes would get 1–3 training images). The labels are then shuffled.

Content: each image shows one large, roughly centred object (like the cell or lesion that fills
most of a real MedMNIST image) on a tissue-like background. The object's class sets its shape
(disc, ring, square, cross, blob cluster, bar, triangle, crescent — a fixed order per flag), its
stripe-texture frequency and a strong colour tint (RGB, amplitude `TINT_AMPLITUDE` on a hue
circle; channels clipped to [0, 1]) or intensity offset (gray). Position (`CENTRE_JITTER`), scale
(`OBJECT_SCALE`), rotation, texture phase, object colour (`COLOUR_JITTER`), background colour and
brightness are random per image, the background is a faint smooth random field plus finer tissue
texture (`FIELD_AMPLITUDES`), and Gaussian pixel noise is added. The cue is strong on purpose:
the tiny smoke classifiers must learn it in a few hundred SGD steps.
`AMBIGUOUS_FRACTION` of the images are drawn with the appearance of a uniformly random class
(their label is unchanged), so no classifier reaches 100 % and the task is not trivial.

Images are rendered in chunks of about `CHUNK_PIXELS` pixels (bounded memory) with one
`np.random.default_rng(seed)` consumed in a fixed order (splits train, val, test; per split:
label shuffle → appearance → chunks), so the same seed gives byte-identical files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpmed.data.medmnist import OFFICIAL_SIZES, SPLITS, MedMNISTInfo, dataset_info, npz_name
from dpmed.errors import ConfigError
from dpmed.io import atomic_dir, write_npz

CHUNK_PIXELS = 1 << 21
AMBIGUOUS_FRACTION = 0.1
NOISE_SD = 0.05
TEXTURE_AMPLITUDE = 0.25
TINT_AMPLITUDE = 0.45  # class colour tint (RGB hue circle) or intensity offset (gray)
OBJECT_SCALE = (0.75, 0.95)  # object half-size range, fraction of the half image side
CENTRE_JITTER = 0.1  # object centre offset range, fraction of the half image side
COLOUR_JITTER = 0.03  # per-image SD of the object colour around its class colour
FIELD_AMPLITUDES = (0.04, 0.02)  # coarse and fine background texture (relative brightness)
CLASS_BALANCES = ("official", "uniform")  # `synthetic.class_balance` values (module docstring)

Sdf = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _cross(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    ax, ay = np.abs(x), np.abs(y)
    return np.minimum(np.maximum(ax - 1.0, ay - 0.3), np.maximum(ax - 0.3, ay - 1.0))


def _blobs(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    angles = np.deg2rad([90.0, 210.0, 330.0])
    dists = [np.hypot(x - 0.55 * np.cos(a), y - 0.55 * np.sin(a)) - 0.42 for a in angles]
    return np.minimum(np.minimum(dists[0], dists[1]), dists[2])


def _triangle(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    half = np.sqrt(3.0) / 2.0
    return np.maximum(np.maximum(-y, half * x + 0.5 * y), -half * x + 0.5 * y) - 0.5


SHAPES: dict[str, Sdf] = {
    "disc": lambda x, y: np.hypot(x, y) - 1.0,
    "ring": lambda x, y: np.abs(np.hypot(x, y) - 0.75) - 0.25,
    "square": lambda x, y: np.maximum(np.abs(x), np.abs(y)) - 0.8,
    "cross": _cross,
    "blobs": _blobs,
    "bar": lambda x, y: np.maximum(np.abs(x) - 1.05, np.abs(y) - 0.35),
    "triangle": _triangle,
    "crescent": lambda x, y: np.maximum(np.hypot(x, y) - 1.0, 0.8 - np.hypot(x - 0.5, y)),
}


@dataclass(frozen=True)
class Style:
    """Fixed per-flag appearance: shape per class, background and object base colours."""

    shapes: tuple[str, ...]
    background: tuple[float, ...]
    foreground: tuple[float, ...]


STYLES: dict[str, Style] = {
    "bloodmnist": Style(
        shapes=("disc", "ring", "blobs", "cross", "square", "crescent", "triangle", "bar"),
        background=(0.93, 0.82, 0.78),
        foreground=(0.55, 0.35, 0.65),
    ),
    "pneumoniamnist": Style(shapes=("disc", "blobs"), background=(0.30,), foreground=(0.65,)),
    "dermamnist": Style(
        shapes=("disc", "blobs", "ring", "square", "crescent", "cross", "triangle"),
        background=(0.85, 0.62, 0.52),
        foreground=(0.55, 0.35, 0.25),
    ),
}


def generate(raw_dir: Path, dataset: str, cfg: dict, seed: int) -> None:
    """Write the synthetic `{flag}[_{size}].npz` of `dataset` into `raw_dir` (replaced atomically).

    `cfg["size"]`: image side (28, 64, 128 or 224); `cfg["synthetic"]["counts"]`: images in
    train, val, test; `cfg["synthetic"]["class_balance"]`: `official` (default) or `uniform`.
    """
    info = dataset_info(dataset)
    size, counts, balance = _check_cfg(dataset, cfg)
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for split, n in zip(SPLITS, counts, strict=True):
        per_class = class_counts(info, n, balance)
        labels = rng.permutation(np.repeat(np.arange(info.n_classes), per_class))
        images = render(labels, size, info, rng)
        arrays[f"{split}_images"] = images
        arrays[f"{split}_labels"] = labels.astype(np.uint8)[:, None]
    with atomic_dir(raw_dir) as tmp:
        write_npz(Path(tmp) / npz_name(dataset, size), **arrays)


def _check_cfg(dataset: str, cfg: dict) -> tuple[int, list[int], str]:
    """Return (size, [n_train, n_val, n_test], class_balance) or raise ConfigError naming the
    key."""
    size = cfg["size"]
    if size not in OFFICIAL_SIZES:
        raise ConfigError(
            f"data.{dataset}.size", f"{size} is not an official size {OFFICIAL_SIZES}"
        )
    counts = list(cfg["synthetic"]["counts"])
    if len(counts) != 3 or any(not isinstance(c, int) or c < 0 for c in counts):
        raise ConfigError(
            f"data.{dataset}.synthetic.counts", f"{counts} must be 3 non-negative integers"
        )
    balance = cfg["synthetic"].get("class_balance", "official")
    if balance not in CLASS_BALANCES:
        raise ConfigError(
            f"data.{dataset}.synthetic.class_balance", f"{balance!r} is not one of {CLASS_BALANCES}"
        )
    return int(size), counts, balance


def class_counts(info: MedMNISTInfo, n: int, balance: str = "official") -> np.ndarray:
    """Images per class for a split of `n` images. `official`: 1 per class when n ≥ n_classes,
    the rest by largest remainder on the official train proportions (ties → lower class
    index); `uniform`: n // n_classes each, the remainder one each to the lowest indices."""
    if balance == "uniform":
        counts = np.full(info.n_classes, n // info.n_classes, dtype=np.int64)
        counts[: n % info.n_classes] += 1
        return counts
    base = np.full(info.n_classes, 1 if n >= info.n_classes else 0, dtype=np.int64)
    rest = n - int(base.sum())
    quota = rest * info.train_proportions
    counts = np.floor(quota).astype(np.int64)
    order = np.argsort(-(quota - counts), kind="stable")
    counts[order[: rest - int(counts.sum())]] += 1
    return base + counts


def render(
    labels: np.ndarray, size: int, info: MedMNISTInfo, rng: np.random.Generator
) -> np.ndarray:
    """Images (N, size, size[, 3]) uint8 for `labels`, rendered in chunks of CHUNK_PIXELS."""
    n_ch = info.channels
    out = np.empty((labels.size, size, size, n_ch), dtype=np.uint8)
    flip = rng.random(labels.size) < AMBIGUOUS_FRACTION
    appearance = np.where(flip, rng.integers(0, info.n_classes, labels.size), labels)
    step = max(1, CHUNK_PIXELS // (size * size))
    for start in range(0, labels.size, step):
        chunk = appearance[start : start + step]
        out[start : start + chunk.size] = _render_chunk(chunk, size, info, rng)
    return out[..., 0] if n_ch == 1 else out


def _render_chunk(
    classes: np.ndarray, size: int, info: MedMNISTInfo, rng: np.random.Generator
) -> np.ndarray:
    """Render images whose appearance class is `classes` (n,) → uint8 (n, size, size, C)."""
    style = STYLES[info.flag]
    n, n_ch = classes.size, info.channels
    centre = rng.uniform(-CENTRE_JITTER, CENTRE_JITTER, (2, n, 1, 1))
    scale = rng.uniform(*OBJECT_SCALE, (n, 1, 1))
    theta = rng.uniform(0.0, 2 * np.pi, (n, 1, 1))
    phase = rng.uniform(0.0, 2 * np.pi, (n, 1, 1))
    fg = _class_colours(style, info.n_classes)[classes] + rng.normal(0.0, COLOUR_JITTER, (n, n_ch))
    bg = np.asarray(style.background) + rng.normal(0.0, 0.04, (n, n_ch))
    brightness = rng.uniform(0.85, 1.15, (n, 1, 1, 1))
    coarse, fine = FIELD_AMPLITUDES
    field = coarse * _smooth_field(rng, n, 6, size) + fine * _smooth_field(rng, n, size // 3, size)
    noise = rng.normal(0.0, NOISE_SD, (n, size, size, n_ch))

    grid = ((np.arange(size) + 0.5) / size * 2.0 - 1.0).astype(np.float32)
    du, dv = grid[None, None, :] - centre[0], grid[None, :, None] - centre[1]
    x = (np.cos(theta) * du + np.sin(theta) * dv) / scale
    y = (-np.sin(theta) * du + np.cos(theta) * dv) / scale
    dist = np.empty((n, size, size), dtype=np.float64)
    for c in np.unique(classes):
        sel = classes == c
        dist[sel] = SHAPES[style.shapes[c]](x[sel], y[sel])
    mask = np.clip(0.5 - dist * scale * size / 2.0, 0.0, 1.0)[..., None]
    freq = (1.5 + 1.0 * classes)[:, None, None]
    texture = 1.0 - TEXTURE_AMPLITUDE * 0.5 * (1.0 + np.cos(np.pi * freq * x + phase))

    background = bg[:, None, None, :] * (1.0 + field[..., None])
    foreground = fg[:, None, None, :] * texture[..., None]
    image = (background * (1.0 - mask) + foreground * mask) * brightness + noise
    return np.rint(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)


def _class_colours(style: Style, n_classes: int) -> np.ndarray:
    """Object base colour per class (n_classes, C): the flag's foreground plus a class tint
    of amplitude TINT_AMPLITUDE along a hue circle (RGB) or cos(2πc/K) intensity (gray)."""
    phi = 2 * np.pi * np.arange(n_classes) / n_classes
    base = np.asarray(style.foreground)
    if base.size == 1:
        return base + TINT_AMPLITUDE * np.cos(phi)[:, None]
    shifts = np.array([0.0, -2 * np.pi / 3, 2 * np.pi / 3])
    return base + TINT_AMPLITUDE * np.cos(phi[:, None] + shifts[None, :])


def _smooth_field(rng: np.random.Generator, n: int, grid: int, size: int) -> np.ndarray:
    """Random field (n, size, size): N(0, 1) values on a grid×grid lattice, bilinearly
    interpolated to the image (a cheap tissue-like texture)."""
    grid = max(2, min(grid, size))
    values = rng.normal(0.0, 1.0, (n, grid, grid))
    interp = _interp_matrix(grid, size)
    return interp[None] @ values @ interp.T[None]


def _interp_matrix(grid: int, size: int) -> np.ndarray:
    """(size, grid) linear-interpolation weights from lattice points to pixel centres."""
    lattice = np.linspace(0.0, 1.0, grid)
    pixels = (np.arange(size) + 0.5) / size
    eye = np.eye(grid)
    return np.stack([np.interp(pixels, lattice, eye[j]) for j in range(grid)], axis=1)
