"""The fets study's preflight (`dpmed.preflight`): on a random processed FeTS folder of the
configured volume shape, one child process per network times the collaborators' side of a
round (local training, validation) and one per cell the server's aggregate, both on the
federation `dpmed.fets.run.prepare` builds; σ is the server's own calibration."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpmed.config.grid import Job
from dpmed.data.fets import MODALITIES, SPLIT_COLUMNS
from dpmed.data.synthetic.fets import REAL_PARTITION_SIZES
from dpmed.fets import run as fets_run
from dpmed.fets.aggregation import DP_MODES
from dpmed.fets.brats import LABEL_VALUES
from dpmed.fets.collaborator import state_to_numpy
from dpmed.fets.grid import server_config
from dpmed.fets.selection import per_round
from dpmed.fets.server import Server
from dpmed.io import write_csv, write_npy
from dpmed.preflight.study import (
    RTOL,
    Calibration,
    ProbePart,
    StudyProbe,
    job_context,
    parameters,
    probe_job,
    steady,
    synchronize,
    timed,
)
from dpmed.privacy import mechanisms


def write_fets(config: Mapping[str, Any], name: str, folder: Path) -> Path:
    """A processed FeTS folder of 2 collaborators with 2 training subjects and one validation
    subject each: float16 (4, X, Y, Z) images and uint8 labels over the BraTS values at the
    configured volume shape (an upper bound of a cropped real one), and splits.csv."""
    shape = tuple(int(s) for s in config["data"][name]["synthetic"]["shape"])
    rng = np.random.default_rng(0)
    rows = []
    for partition in (1, 2):
        for k in range(3):
            sid = f"P{partition:02d}S{k:02d}"
            image = rng.random((len(MODALITIES), *shape), dtype=np.float32).astype(np.float16)
            label = rng.choice(np.asarray(LABEL_VALUES, dtype=np.uint8), size=shape)
            write_npy(folder / "subjects" / f"{sid}.image.npy", image)
            write_npy(folder / "subjects" / f"{sid}.label.npy", label)
            rows.append((sid, partition, "train" if k < 2 else "val"))
    write_csv(folder / "splits.csv", pd.DataFrame(rows, columns=list(SPLIT_COLUMNS)))
    return folder


def round_updates(params: Mapping[str, Any]) -> int:
    """Updates the server aggregates per round of the real federation: the collaborators the
    configured participation chooses of its institutions."""
    return per_round(len(REAL_PARTITION_SIZES), float(params["participation"]))


def probe_collaborators(spec: dict[str, Any]) -> dict[str, Any]:
    """The collaborators' side of a round: two collaborators each train on their two
    subjects (`Collaborator.train`), then one full-volume validation. The server's rule,
    participation and ε0 do not enter, so every fets cell of one network shares this probe."""
    job = probe_job(spec, Path(spec["data_dir"]))
    prepared = fets_run.prepare(job)
    device, federation, params = prepared.device, prepared.federation, job.params
    global_state = state_to_numpy(federation.model)
    batch = int(params["batch_size"])
    times, trained = [], global_state
    for collaborator in federation.collaborators.values():
        n_patches = collaborator.n_train * int(params["patches_per_subject"])
        steps = math.ceil(float(params["local_epochs"]) * n_patches / batch)
        start = time.perf_counter()
        trained, _ = collaborator.train(global_state, 0)
        synchronize(device)
        times += [(time.perf_counter() - start) / steps] * steps
    last = list(federation.collaborators.values())[-1]
    validation = timed(lambda: last.validate(trained), device) / max(1, last.n_val)
    return {
        "step_seconds": times,
        "seconds_per_step": steady(times),
        "val_seconds_per_volume": validation,
        "parameters": parameters(federation.model),
    }


def probe_server(spec: dict[str, Any]) -> dict[str, Any]:
    """The server's side of a round, on CPU: `Server.aggregate` of as many updates as the
    configured participation chooses (DP noise included). The updates are two distinct
    perturbations of the global model, repeated: the aggregate's cost depends on the count and
    size of the updates, not on their values."""
    job = probe_job(spec, Path(spec["data_dir"]))
    prepared = fets_run.prepare(replace(job, device="cpu"))
    federation = prepared.federation
    global_state = state_to_numpy(federation.model)
    rng = np.random.default_rng(job.seed)
    local = [(name, {k: v + rng.normal(0.0, 1e-3, v.shape).astype(v.dtype)
                     for k, v in global_state.items()}, float(c.n_train))
             for name, c in list(federation.collaborators.items())[:2]]  # fmt: skip
    chosen = round_updates(job.params)
    updates = [local[k % len(local)] for k in range(chosen)]
    server = Server(prepared.server)
    out: list[Any] = []
    aggregate = timed(lambda: out.append(server.aggregate(global_state, updates, 1)),
                      prepared.device)  # fmt: skip
    mech = out[0][1]
    return {
        "aggregate_seconds": aggregate,
        "updates": chosen,
        "sigma": None if mech is None else mech.noise_multiplier,
        "parameters": parameters(federation.model),
    }


def calibrate(config: Mapping[str, Any], job: Job, eps: float) -> Calibration:
    """The server's σ of a whole-model DP mode (`AggregatorMode.sound_sigma`), checked against
    δ0 with the exact Gaussian privacy profile (analytic calibration) or RDP (rdp calibration). The
    paper mode's per-tensor classic σ is a paper approximation without a guarantee (its noise
    multiplier is reported, its check is empty)."""
    context = job_context(job)
    cfg = server_config(context.params, context.wildcards, context.seed)
    if DP_MODES[cfg.dpmode].per_tensor:
        z = math.sqrt(2.0 * math.log(1.25 / cfg.delta0)) / eps  # classic σ/Δf (Algorithm 2)
        return Calibration(eps, z, z, None, None, "paper approximation: classic σ per tensor")
    chosen = round_updates(job.params)
    sigma, delta_f = cfg.mode.sound_sigma(cfg, chosen)
    z = sigma / delta_f
    if cfg.sound_calibration == "rdp":
        spent = mechanisms.rdp_epsilon(z, 1, cfg.delta0)
        ok = spent <= eps * (1 + RTOL)
    else:
        spent = eps if mechanisms.gaussian_delta(z, eps) <= cfg.delta0 * (1 + RTOL) else math.inf
        ok = math.isfinite(spent)
    return Calibration(eps, z, z, spent, ok, f"{chosen} updates/round, {cfg.sound_calibration}")


PROBE = StudyProbe(
    parts=(
        ProbePart("collaborators", "fets_collaborators", shared=True),
        ProbePart("server", "fets_server"),
    ),
    probes={"fets_collaborators": probe_collaborators, "fets_server": probe_server},
    calibrate=calibrate,
    data_name=lambda wildcards: "fets",
    write_data=write_fets,
)
