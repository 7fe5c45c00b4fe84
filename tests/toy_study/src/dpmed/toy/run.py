"""The toy job: release Σ clip_C(x_i) + N(0, σ²I) over the training images x_i (flattened, in
[0, 1]) and score the mean it gives against the true mean."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpmed.config.wildcards import parse_eps
from dpmed.data.npz import read_npz
from dpmed.io import write_json
from dpmed.privacy.mechanisms import analytic_sigma
from dpmed.privacy.record import PrivacyRecord
from dpmed.runtime import JobContext

MECHANISM = "Gaussian sum of clipped images"
ADJACENCY = "sample-level (add/remove one image)"


@dataclass(frozen=True)
class ToySetup:
    """What the job, its audit and its probe share: the clipped images (n, d) and σ (the noise
    std; 0 for a non-private run)."""

    clipped: np.ndarray
    clip_norm: float
    sigma: float
    eps: float
    delta: float


def clip(images: np.ndarray, clip_norm: float) -> np.ndarray:
    """Each row scaled to L2 norm at most `clip_norm`."""
    norms = np.linalg.norm(images, axis=1, keepdims=True)
    return images * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-12))


def setup(images: np.ndarray, job: JobContext) -> ToySetup:
    """The setup of `job` over `images` (uint8, any shape per image)."""
    eps = parse_eps(job.wildcards["eps"])
    delta, clip_norm = job.params["delta"], job.params["clip_norm"]
    flat = images.reshape(len(images), -1).astype(np.float64) / 255.0
    sigma = 0.0 if np.isinf(eps) else analytic_sigma(clip_norm, eps, delta)
    return ToySetup(clip(flat, clip_norm), clip_norm, sigma, eps, delta)


def prepare(job: JobContext) -> ToySetup:
    """The setup of `job` over its processed training split."""
    return setup(read_npz(Path(job.processed_dir) / "train.npz", ("images",))["images"], job)


def release(total: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """The mechanism: a sum plus N(0, σ²) per coordinate."""
    return total + rng.normal(0.0, sigma, size=total.shape)


def run(job: JobContext) -> None:
    """Write metrics.json and privacy.json of `job`."""
    setup_ = prepare(job)
    noisy = release(setup_.clipped.sum(axis=0), setup_.sigma, np.random.default_rng(job.seed))
    mse = float(np.mean((noisy / len(setup_.clipped) - setup_.clipped.mean(axis=0)) ** 2))
    out = Path(job.out_dir)
    write_json(out / "metrics.json", {"mse": mse, "sigma": setup_.sigma})
    if setup_.sigma == 0:
        record = PrivacyRecord.non_private(MECHANISM, ADJACENCY, "all")
    else:
        record = PrivacyRecord(
            mechanism=MECHANISM, adjacency=ADJACENCY, sampling="all", accountant="analytic",
            epsilon=setup_.eps, delta=setup_.delta, guarantee="dp", clip_norm=setup_.clip_norm,
            noise_multipliers=[setup_.sigma / setup_.clip_norm], covers="the released noisy sum",
            not_covered=["metrics.json: its mse compares the release with the private mean"],
        )  # fmt: skip
    record.write(out / "privacy.json", job.wildcards["dataset"])
