"""Structure measure S_α and mean enhanced-alignment measure E_φ (Inf-Net evaluation, paper
002 §4.2), following PySODMetrics (Fan et al. 2017, 2018).

Inputs per image: a foreground probability map in [0, 1] and a binary ground truth. As in
PySODMetrics the map is min-max normalised when it is not constant.

S_α = α·S_object + (1 − α)·S_region (α = 0.5), clipped at 0; GT all background → 1 − mean(p),
GT all foreground → mean(p). S_object: u·O(p[g]) + (1 − u)·O((1 − p)[¬g]), u = mean(g),
O(x) = 2x̄/(x̄² + 1 + std(x) + eps) (std with ddof 1). S_region: split at the GT centroid into
four quadrants weighted by area, each scored by SSIM 4 x̄ȳσ_xy/((x̄² + ȳ²)(σ_x² + σ_y²)) (1 when
numerator and denominator are 0, 0 when only the numerator is).

E_φ(T) for the binary prediction p·255 ≥ T (uint8 map, T = 0…255): ξ = 2 φ_p φ_g/(φ_p² + φ_g²)
with φ = x − mean(x), enhanced (ξ + 1)²/4, summed and divided by (N − 1); GT all background →
the count of predicted background pixels, all foreground → of predicted foreground ones, each
over (N − 1). mean E_φ = mean over the 256 thresholds.
"""

from __future__ import annotations

import numpy as np

EPS = np.spacing(1)


def _prepare(pred: np.ndarray, gt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred = np.asarray(pred, dtype=np.float64)
    if pred.max() != pred.min():
        pred = (pred - pred.min()) / (pred.max() - pred.min())
    return pred, np.asarray(gt).astype(bool)


def _s_object(x: np.ndarray) -> float:
    mean = float(np.mean(x))
    std = float(np.std(x, ddof=1)) if x.size > 1 else 0.0
    return 2 * mean / (mean**2 + 1 + std + EPS)


def _ssim(pred: np.ndarray, gt: np.ndarray) -> float:
    n = pred.size
    if n == 0:
        return 0.0
    x, y = pred.mean(), gt.mean()
    denom = max(n - 1, 1)
    sx = ((pred - x) ** 2).sum() / denom
    sy = ((gt - y) ** 2).sum() / denom
    sxy = ((pred - x) * (gt - y)).sum() / denom
    alpha = 4 * x * y * sxy
    beta = (x**2 + y**2) * (sx + sy)
    if alpha != 0:
        return float(alpha / (beta + EPS))
    return 1.0 if beta == 0 else 0.0


def _region(pred: np.ndarray, gt: np.ndarray) -> float:
    h, w = gt.shape
    if gt.any():
        cy, cx = np.argwhere(gt).mean(axis=0).round()
    else:
        cy, cx = np.round(h / 2), np.round(w / 2)
    x, y = int(cx) + 1, int(cy) + 1
    area = h * w
    w1 = x * y / area
    w2 = y * (w - x) / area
    w3 = (h - y) * x / area
    w4 = 1 - w1 - w2 - w3
    g = gt.astype(np.float64)
    parts = [
        (pred[:y, :x], g[:y, :x]),
        (pred[:y, x:], g[:y, x:]),
        (pred[y:, :x], g[y:, :x]),
        (pred[y:, x:], g[y:, x:]),
    ]
    return sum(wk * _ssim(p, q) for wk, (p, q) in zip((w1, w2, w3, w4), parts, strict=True))


def s_measure(pred: np.ndarray, gt: np.ndarray, alpha: float = 0.5) -> float:
    """S_α of one (H, W) probability map against a binary mask."""
    pred, gt = _prepare(pred, gt)
    y = gt.mean()
    if y == 0:
        return float(1 - pred.mean())
    if y == 1:
        return float(pred.mean())
    u = y
    obj = u * _s_object(pred[gt]) + (1 - u) * _s_object((1 - pred)[~gt])
    return float(max(0.0, alpha * obj + (1 - alpha) * _region(pred, gt)))


def e_measure_curve(pred: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """E_φ at the thresholds T = 0…255 of the uint8 map (shape (256,))."""
    pred, gt = _prepare(pred, gt)
    pred_u8 = (pred * 255).astype(np.uint8)
    n = gt.size
    thresholds = np.arange(256)[:, None]
    binary = pred_u8.reshape(1, -1) >= thresholds  # (256, N)
    g = gt.reshape(1, -1)
    if not gt.any():
        return (~binary).sum(axis=1) / (n - 1 + EPS)
    if gt.all():
        return binary.sum(axis=1) / (n - 1 + EPS)
    phi_p = binary - binary.mean(axis=1, keepdims=True)
    phi_g = g - g.mean()
    align = 2 * phi_p * phi_g / (phi_p**2 + phi_g**2 + EPS)
    enhanced = (align + 1) ** 2 / 4
    return enhanced.sum(axis=1) / (n - 1 + EPS)


def mean_e_measure(pred: np.ndarray, gt: np.ndarray) -> float:
    """Mean E_φ over the 256 thresholds."""
    return float(e_measure_curve(pred, gt).mean())
