"""The toy study's audit ("record"): m Dirac canary images of norm C on distinct pixels, each
added to the training set with probability 1/2; the score of a canary is its pixel of the
release minus the other images' clipped sum there (the auditor knows every other image)."""

from __future__ import annotations

import numpy as np
from dpmed.toy.run import prepare, release

from dpmed.privacy.audit.bound import best_audit
from dpmed.privacy.audit.cell import CellAudit
from dpmed.runtime import JobContext
from dpmed.seeding import stable_seed


def audit_cell(
    job: JobContext, setting: str, canaries: int, confidence: float = 0.95, noise_scale: float = 1.0
) -> CellAudit:
    """Audit the toy job `job` with `canaries` canaries."""
    setup = prepare(job)
    rng = np.random.default_rng(stable_seed(job.seed, "privacy-audit", setting))
    pixels = rng.choice(setup.clipped.shape[1], size=canaries, replace=False)
    included = rng.random(canaries) < 0.5
    total = setup.clipped.sum(axis=0)
    with_canaries = total.copy()
    with_canaries[pixels[included]] += setup.clip_norm
    noisy = release(with_canaries, setup.sigma * noise_scale, rng)
    scores = noisy[pixels] - total[pixels]
    return CellAudit("toy", "gaussian-sum", setting, "dp", setup.eps, noise_scale,
                     setup.clip_norm, dict(job.wildcards),
                     best_audit(scores, included, confidence, setup.delta))  # fmt: skip
