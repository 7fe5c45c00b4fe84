"""ROAD: RemOve And Debias (Rong et al. 2022) with noisy linear imputation, scored as XCal-FL
reports it (paper 001, "Pushing the (Decision) Boundaries", §6 "Model Explainability").

Pixels are ranked by attribution (plus N(0, 1e-4²) noise to break ties); for a fraction p the
top-p pixels (MoRF, most relevant first) or the bottom-p pixels (LeRF) are removed and imputed:
each removed pixel equals the weighted mean of its in-image 8-neighbours (weight 1/6 direct,
1/12 diagonal, normalised over the neighbours that exist), all removed pixels solved jointly as
one sparse linear system (the same matrix for every channel, factorised once), plus
N(0, noise_std²) on the imputed values. The unchanged model then scores the imputed image by the
softmax probability ("confidence") of the class it predicted on the original.

With c₀ the mean confidence on the originals and c(p) the mean on the images with fraction p
removed, the confidence drop is 100 (c₀ − c(p)) / c₀ in % (relative to c₀; negative = the
confidence rose). The paper's ROAD score is the MoRF drop: "confidence fell by over 80 % when
the most salient regions were removed"; the paper gives no removal fractions, so ROAD here is
the mean MoRF drop over the configured fractions. The older combined score
(mean_p LeRF − mean_p MoRF) / 2 ∈ [−0.5, 0.5] (probability units) is kept beside it.

Removing pixels lowers the confidence whatever their ranking (the imputed image is off the
training distribution), so a ROAD score means something only beside the same score for a
ranking that carries no information: `random_attributions` gives uniform random maps, and the
gap between the two MoRF drops is what the explanation adds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import splu

OFFSETS = ((-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))
WEIGHTS = (1 / 6,) * 4 + (1 / 12,) * 4
TIE_NOISE = 1e-4


def impute(
    image: np.ndarray, removed: np.ndarray, noise_std: float, rng: np.random.Generator
) -> np.ndarray:
    """Noisy linear imputation of the `removed` (H, W) bool pixels of `image` (C, H, W)."""
    image = np.asarray(image, dtype=np.float64)
    removed = np.asarray(removed, dtype=bool)
    _, height, width = image.shape
    rows, cols = np.nonzero(removed)
    n = rows.size
    if n == 0:
        return image.copy()
    unknown_id = -np.ones((height, width), dtype=np.int64)
    unknown_id[rows, cols] = np.arange(n)
    total = np.zeros(n)
    a_rows, a_cols, a_vals = [], [], []
    rhs = np.zeros((n, image.shape[0]))
    for (dr, dc), w in zip(OFFSETS, WEIGHTS, strict=True):
        nr, nc = rows + dr, cols + dc
        inside = (nr >= 0) & (nr < height) & (nc >= 0) & (nc < width)
        idx = np.flatnonzero(inside)
        total[idx] += w
        neigh = unknown_id[nr[idx], nc[idx]]
        is_unknown = neigh >= 0
        a_rows.append(idx[is_unknown])
        a_cols.append(neigh[is_unknown])
        a_vals.append(np.full(int(is_unknown.sum()), -w))
        known = idx[~is_unknown]
        rhs[known] += w * image[:, nr[known], nc[known]].T
    a_rows.append(np.arange(n))
    a_cols.append(np.arange(n))
    a_vals.append(total)
    matrix = sp.csc_matrix(
        (np.concatenate(a_vals), (np.concatenate(a_rows), np.concatenate(a_cols))), shape=(n, n)
    )
    solved = splu(matrix).solve(rhs)
    if noise_std > 0:
        solved = solved + rng.normal(0.0, noise_std, size=solved.shape)
    out = image.copy()
    out[:, rows, cols] = solved.T
    return out


def random_attributions(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Uniform random attribution maps of `shape` (N, H, W): the uninformative baseline."""
    return np.random.default_rng(seed).random(shape)


def removal_mask(attribution: np.ndarray, fraction: float, most_relevant: bool) -> np.ndarray:
    """(H, W) bool: the round(fraction·H·W) highest (MoRF) or lowest (LeRF) attributions."""
    flat = attribution.reshape(-1)
    k = int(round(fraction * flat.size))
    order = np.argsort(-flat if most_relevant else flat, kind="stable")
    mask = np.zeros(flat.size, dtype=bool)
    mask[order[:k]] = True
    return mask.reshape(attribution.shape)


def confidence_drop(base: float, curve: Sequence[float]) -> list[float]:
    """100 (base − c) / base for each mean confidence c of `curve`: the drop in % of `base`."""
    return [100.0 * (base - c) / base for c in curve]


def road(
    predict: Callable[[np.ndarray], np.ndarray],
    images: np.ndarray,
    attributions: np.ndarray,
    percentages: Sequence[float],
    seed: int,
    noise_std: float = 0.01,
) -> dict:
    """ROAD of `attributions` (N, H, W) for `images` (N, C, H, W) in [0, 1].

    `predict` maps images (M, C, H, W) to softmax probabilities (M, K). Returns a dict with
    `percentages` (removed fractions p), `base` (mean confidence c₀ on the originals), `morf`
    and `lerf` (mean confidence c(p) per p), `morf_drop` and `lerf_drop` (confidence drop in %
    per p), `road` = mean of `morf_drop` (the paper's ROAD, %) and `combined` =
    (mean lerf − mean morf) / 2.
    """
    rng = np.random.default_rng(seed)
    images = np.asarray(images, dtype=np.float64)
    probs = predict(images)
    target = probs.argmax(axis=1)
    ranked = attributions + rng.normal(0.0, TIE_NOISE, size=attributions.shape)
    curves: dict[str, list[float]] = {"morf": [], "lerf": []}
    for p in percentages:
        for name, most in (("morf", True), ("lerf", False)):
            batch = np.stack(
                [
                    impute(img, removal_mask(att, p, most), noise_std, rng)
                    for img, att in zip(images, ranked, strict=True)
                ]
            )
            out = predict(batch)
            curves[name].append(float(out[np.arange(len(target)), target].mean()))
    base = float(probs[np.arange(len(target)), target].mean())
    morf_drop = confidence_drop(base, curves["morf"])
    return {
        "percentages": [float(p) for p in percentages],
        "base": base,
        "morf": curves["morf"],
        "lerf": curves["lerf"],
        "morf_drop": morf_drop,
        "lerf_drop": confidence_drop(base, curves["lerf"]),
        "road": float(np.mean(morf_drop)),
        "combined": (float(np.mean(curves["lerf"])) - float(np.mean(curves["morf"]))) / 2,
    }
