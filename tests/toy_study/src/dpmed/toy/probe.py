"""The toy study's preflight: time the clipped sum over stand-in images of the configured
size; σ from the analytic Gaussian mechanism."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from dpmed.toy.run import setup

from dpmed.config.grid import Job
from dpmed.data.registry import DATASET_REGISTRY
from dpmed.preflight.study import Calibration, ProbePart, StudyProbe, probe_job
from dpmed.privacy.mechanisms import analytic_sigma, gaussian_delta


def probe_sum(spec: dict[str, Any]) -> dict[str, Any]:
    """Seconds per image of the clipped sum, on random images."""
    job = probe_job(spec, spec.get("data_dir") or ".")
    data = spec["config"]["data"][job.wildcards["dataset"]]
    n = DATASET_REGISTRY[job.wildcards["dataset"]].images(data)[1]
    images = np.random.default_rng(0).integers(0, 256, (n, data["size"], data["size"]), np.uint8)
    start = time.perf_counter()
    setup(images, job).clipped.sum(axis=0)
    return {"seconds_per_image": (time.perf_counter() - start) / n, "parameters": 0}


def calibrate(config: Mapping[str, Any], job: Job, eps: float) -> Calibration:
    """σ for ε by the analytic Gaussian mechanism, checked by its exact δ."""
    clip_norm, delta = job.params["clip_norm"], job.params["delta"]
    sigma = analytic_sigma(clip_norm, eps, delta)
    ok = gaussian_delta(sigma / clip_norm, eps) <= delta * (1 + 1e-9)
    return Calibration(eps, sigma / clip_norm, sigma / clip_norm, eps, ok, "analytic Gaussian")


PROBE = StudyProbe(parts=(ProbePart("", "toy_sum"),), probes={"toy_sum": probe_sum},
                   calibrate=calibrate)  # fmt: skip
