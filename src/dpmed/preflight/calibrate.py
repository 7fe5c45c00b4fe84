"""σ for every ε of a cell, calibrated by the runners' own code, and the accounted ε it gives.

Calibration needs only counts (the sampling rate q and the number of steps), so it runs on
counts-only stand-in data (`dpmed.preflight.data` at a tiny image size) in this process, for
every distinct cell and ε of the grid, before any probe:

- seg: `dpmed.seg.run.Plan` gives q = batch/N_train and epochs·⌊1/q⌋ steps; σ from
  `accounting.noise_multiplier` with the job's accountant, checked by `accounting.epsilon`.
- xcal: the run's `Client`s (partition by the cell's shift, the server's schedule) calibrate
  themselves (`Method.calibrate`); every client's σ is checked by the RDP accountant (XCal-FL:
  gradient and signal budgets separately, and its proven bound against ε).
- fets: the server's σ of the whole-model DP modes (`Server.sound_sigma`), checked against
  δ0 with the exact Gaussian privacy profile (analytic calibration) or RDP (rdp calibration).
  The paper mode's per-tensor classic σ is a paper approximation without a guarantee (its
  noise multiplier is reported, its check is empty).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpmed.config.grid import Job, job_seed
from dpmed.config.wildcards import parse_eps
from dpmed.preflight.cells import Cell
from dpmed.runtime import JobContext

RTOL = 1e-9  # slack of the ε ≤ target check (float rounding of the accountant)


@dataclass(frozen=True)
class Calibration:
    """σ of one (cell, ε): the noise multiplier (smallest and largest over a federation's
    clients), the accounted ε, and whether it is within the target (None: no guarantee to
    check: non-private, or a paper approximation)."""

    eps: float
    sigma_min: float | None
    sigma_max: float | None
    accounted: float | None
    ok: bool | None
    note: str = ""


def job_context(job: Job, processed: Path = Path("."), out: Path = Path(".")) -> JobContext:
    """The JobContext the workflow would give `job` (its seed), on CPU."""
    return JobContext(processed, out, job.wc, job.params, job_seed(job.study, job.wc), "cpu")


def _with_eps(cell: Cell, eps: float) -> Job:
    """The cell's first job at `eps`."""
    return next(job for job in cell.jobs if parse_eps(job.wc["eps"]) == eps)


_COUNTS_ONLY: dict[tuple[str, str, int], Any] = {}


def _counts_only_seg(dataset: str, cfg: Mapping[str, Any], depth: int) -> Any:
    """Seg data with the configured counts at 2^depth pixels (what `Plan` needs), cached."""
    from dpmed.preflight.data import seg_data

    key = (dataset, json.dumps(cfg, sort_keys=True, default=str), depth)
    if key not in _COUNTS_ONLY:
        _COUNTS_ONLY[key] = seg_data(cfg, dataset, seed=0, size=(2**depth, 2**depth))
    return _COUNTS_ONLY[key]


def _seg(config: Mapping[str, Any], job: Job, eps: float) -> Calibration:
    from dpmed.privacy import accounting
    from dpmed.seg.run import Plan

    dataset, params = job.wc["dataset"], job.params
    cfg = config["data"][dataset]
    data = _counts_only_seg(dataset, cfg, int(params["depth"]))
    plan = Plan.of(job_context(job), data)
    steps = plan.epochs * plan.steps_per_epoch
    delta, accountant = float(params["delta"]), params["accountant"]
    sigma = accounting.noise_multiplier(eps, delta, plan.q, steps, accountant)
    spent = accounting.epsilon([(sigma, plan.q, steps)], delta, accountant)
    return Calibration(eps, sigma, sigma, spent, spent <= eps * (1 + RTOL),
                       f"q={plan.q:.4g}, steps={steps}, {accountant}")  # fmt: skip


def _xcal(config: Mapping[str, Any], job: Job, eps: float) -> Calibration:
    import numpy as np
    import torch

    from dpmed.preflight.data import medmnist_labels
    from dpmed.privacy import accounting
    from dpmed.seeding import stable_seed
    from dpmed.xcal.client import Client, ClientSeeds
    from dpmed.xcal.methods import resolve
    from dpmed.xcal.run import client_schedule
    from dpmed.xcal.shifts import partition

    wc, params = job.wc, job.params
    dataset = wc["dataset"]
    synthetic = config["data"][dataset]["synthetic"]
    n = int(synthetic["counts"][0])
    labels = medmnist_labels(dataset, n, seed=0, balance=synthetic.get("class_balance", "official"))
    images = np.zeros((n, 1, 1, 1), dtype=np.uint8)  # counts only
    context = job_context(job)
    seed = stable_seed("xcal-partition", *(wc[k] for k in ("dataset", "shift", "clients", "seed")))
    parts = partition(images, labels, wc["shift"], int(wc["clients"]), params, seed)
    schedule = client_schedule(context)
    method = resolve(wc["method"], True, params["presets"])
    sigmas, spent, ok = [], 0.0, True
    for k, (_, y) in enumerate(parts):
        rounds = sum(k in sampled for sampled in schedule)
        if rounds == 0:
            continue
        client = Client(k, torch.zeros((len(y), 1, 1, 1)), torch.from_numpy(y), method, params,
                        eps, ClientSeeds(0, 0, 0), "", planned_rounds=rounds)  # fmt: skip
        history = [(client.sigma_ref, client.q, client.total_steps)]
        if hasattr(client, "eps_grad"):  # XCal-FL: gradient and signal budgets, proven bound
            grad = accounting.epsilon(history, client.delta_grad)
            signal_history = [(client.sigma_signal, client.q, client.total_steps)]
            signal = accounting.epsilon(signal_history, client.delta_signal)
            client_eps = method.filter_epsilon(client)
            ok &= grad <= client.eps_grad * (1 + RTOL) and signal <= client.eps_signal * (1 + RTOL)
        else:
            client_eps = accounting.epsilon(history, client.delta)
        ok &= client_eps <= eps * (1 + RTOL)
        sigmas.append(client.sigma_ref)
        spent = max(spent, client_eps)
    note = f"{len(sigmas)} clients, σ_ref per client"
    return Calibration(eps, min(sigmas), max(sigmas), spent, bool(ok), note)


def _fets(config: Mapping[str, Any], job: Job, eps: float) -> Calibration:
    from dpmed.fets.aggregation import DP_MODES
    from dpmed.fets.run import server_config
    from dpmed.fets.server import Server
    from dpmed.job_cost import FETS_PARTITIONS
    from dpmed.privacy import mechanisms

    params = job.params
    cfg = server_config(job_context(job))
    if DP_MODES[cfg.dpmode].per_tensor:
        z = math.sqrt(2.0 * math.log(1.25 / cfg.delta0)) / eps  # classic σ/Δf (Algorithm 2)
        return Calibration(eps, z, z, None, None, "paper approximation: classic σ per tensor")
    chosen = max(1, math.floor(float(params["participation"]) * FETS_PARTITIONS + 1e-9))
    sigma, delta_f = Server(cfg).sound_sigma(chosen)
    z = sigma / delta_f
    if cfg.sound_calibration == "rdp":
        spent = mechanisms.rdp_epsilon(z, 1, cfg.delta0)
        ok = spent <= eps * (1 + RTOL)
    else:
        spent = eps if mechanisms.gaussian_delta(z, eps) <= cfg.delta0 * (1 + RTOL) else math.inf
        ok = math.isfinite(spent)
    return Calibration(eps, z, z, spent, ok, f"{chosen} updates/round, {cfg.sound_calibration}")


CALIBRATORS = {"seg": _seg, "xcal": _xcal, "fets": _fets}


def calibrate(config: Mapping[str, Any], cell: Cell) -> list[Calibration]:
    """σ and its check for every ε of `cell` (one row at ε = inf for a non-private cell); a
    calibration that fails is a row with ok False and the error in its note."""
    out = []
    for eps in cell.eps:
        if math.isinf(eps):
            out.append(Calibration(eps, None, None, None, None, "non-private"))
            continue
        try:
            out.append(CALIBRATORS[cell.study](config, _with_eps(cell, eps), eps))
        except (ValueError, RuntimeError) as err:
            out.append(Calibration(eps, None, None, None, False, f"{type(err).__name__}: {err}"))
    return out
