"""XCal-FL study runner (paper 001): in-process FedAvg over clients of one MedMNIST dataset.

One run = one cell of the xcal grid (dataset, model, method, shift, clients, eps, seed). The
training split is partitioned over the clients (IID, label shift by per-class Dirichlet(α), or
covariate shift by per-client brightness factors; `dpmed.data.partition`); the clients train
locally (`xcal_client`) and send only model tensors and their ledger; the server averages the
tensors weighted by client sample count (FedAvg) and evaluates the global model on the official
test split after every round (macro F1, accuracy; ROAD every `road_every` rounds and at the end,
on a fixed test subsample shared by every run of the dataset). Outputs in `out_dir`:
rounds.csv (round, f1, accuracy, epsilon = max over clients of ε spent so far, road, seconds),
metrics.json, privacy.json, road.json, gradcam.npz (Grad-CAM examples of the final model).
A checkpoint after every round lets a killed run resume; it is removed when the run finishes.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dpmed.config.wildcards import parse_eps
from dpmed.data.partition import (
    apply_brightness,
    partition_covariate_shift,
    partition_iid,
    partition_label_shift,
)
from dpmed.federated.averaging import weighted_mean
from dpmed.io import write_csv, write_json, write_npz
from dpmed.models.classifiers import GRAD_SAMPLE_MODE, build_classifier, gradcam_layer
from dpmed.runtime import Progress, load_checkpoint, save_checkpoint, seed_everything, select_device
from dpmed.seeding import stable_seed
from dpmed.xcal import evaluate as xcal_eval
from dpmed.xcal.client import Client, ClientUpdate, MethodSpec, method_spec
from dpmed.xcal.dpsgd import wrap
from dpmed.xcal.privacy import privacy_record

N_GRADCAM_EXAMPLES = 4


def load_split(processed_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 (N, H, W, C) and labels int64 (N,) of one processed MedMNIST split."""
    with np.load(Path(processed_dir) / f"{split}.npz", allow_pickle=False) as npz:
        return npz["images"], npz["labels"]


def to_tensor(images: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 (N, H, W, C) → float32 (N, C, H, W) in [0, 1] on `device`."""
    x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    return (x.to(torch.float32) / 255.0).to(device)


def partition(
    images: np.ndarray, labels: np.ndarray, shift: str, n_clients: int, params: dict, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(images, labels) per client for `shift` iid | label | covariate."""
    if shift == "iid":
        parts = partition_iid(labels.size, n_clients, seed)
        return [(images[i], labels[i]) for i in parts]
    if shift == "label":
        split = partition_label_shift(labels, n_clients, params["dirichlet_alpha"], seed, 1)
        return [(images[i], labels[i]) for i in split.indices]
    if shift == "covariate":
        low, high = params["brightness"]
        cov = partition_covariate_shift(labels.size, n_clients, seed, low, high)
        return [
            (apply_brightness(images[i], f), labels[i])
            for i, f in zip(cov.indices, cov.factors, strict=True)
        ]
    raise ValueError(f"unknown shift '{shift}'")


def fedavg(updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
    """Σ_k n_k w_k / Σ_k n_k for every tensor (FedAvg weighted by client sample count)."""
    weights = [u.n_samples for u in updates]
    return {
        key: weighted_mean([u.tensors[key] for u in updates], weights) for key in updates[0].tensors
    }


def road_subsample(n_test: int, size: int, dataset: str) -> np.ndarray:
    """Fixed test indices for ROAD: the first `size` of a permutation seeded by the dataset."""
    rng = np.random.default_rng(stable_seed("xcal-road-subsample", dataset))
    return np.sort(rng.permutation(n_test)[: min(size, n_test)])


def efficiency(values: list[float | None], eps: list[float | None]) -> float | None:
    """(last − first) / (ε_last − ε_first) over the rounds that have a value (None if ε is
    unchanged or undefined)."""
    pairs = [(v, e) for v, e in zip(values, eps, strict=True) if v is not None and e is not None]
    if len(pairs) < 2 or not pairs[-1][1] > pairs[0][1]:
        return None
    return (pairs[-1][0] - pairs[0][0]) / (pairs[-1][1] - pairs[0][1])


def run_xcal(
    processed_dir: str | Path,
    out_dir: str | Path,
    wildcards: dict[str, str],
    params: dict,
    seed: int,
    device: str = "auto",
    threads: int | None = None,
) -> dict:
    """Run one grid cell and write its outputs (module docstring); returns metrics.json."""
    out_dir = Path(out_dir)
    seed_everything(seed, threads)
    dev = select_device(device)
    meta = json.loads((Path(processed_dir) / "meta.json").read_text())
    n_classes, channels, size = int(meta["n_classes"]), int(meta["channels"]), int(meta["size"])
    eps = parse_eps(wildcards["eps"])
    private = math.isfinite(eps)
    spec = method_spec(wildcards["method"], private, params["presets"])
    n_clients = int(wildcards["clients"])

    train_images, train_labels = load_split(processed_dir, "train")
    test_images, test_labels = load_split(processed_dir, "test")
    # Paired comparisons: every method of a (dataset, shift, clients, seed) cell sees the same
    # partition and every method of a (dataset, model, seed) the same initial model; the job
    # seed drives only sampling and noise.
    cell = [wildcards[k] for k in ("dataset", "shift", "clients", "seed")]
    parts = partition(
        train_images,
        train_labels,
        wildcards["shift"],
        n_clients,
        params,
        stable_seed("xcal-partition", *cell),
    )
    x_test, y_test = to_tensor(test_images, dev), torch.from_numpy(test_labels).to(dev)
    road_idx = road_subsample(len(test_labels), params["road_subsample"], wildcards["dataset"])

    torch.manual_seed(
        stable_seed("xcal-init", wildcards["dataset"], wildcards["model"], wildcards["seed"])
    )
    net = build_classifier(wildcards["model"], channels, n_classes, size, params["width_scale"]).to(
        dev
    )
    layer = gradcam_layer(net, channels, size)
    wrapped = wrap(net, GRAD_SAMPLE_MODE[wildcards["model"]]) if spec.kind != "plain" else None
    evaluated = wrapped if wrapped is not None else net
    clients = [
        Client(
            k,
            to_tensor(imgs, dev),
            torch.from_numpy(labels).to(dev),
            spec,
            params,
            eps,
            stable_seed(seed, "client", k),
            layer,
        )
        for k, (imgs, labels) in enumerate(parts)
    ]

    ev = xcal_eval.Evaluation(
        evaluated,
        layer,
        x_test,
        y_test,
        n_classes,
        road_idx,
        list(params["road_percentages"]),
        stable_seed("xcal-road-noise", wildcards["dataset"]),
    )
    last_road = None
    checkpoint_path = out_dir / "checkpoint.pt"
    state = load_checkpoint(checkpoint_path, dev)
    global_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    rows: list[dict] = []
    start, elapsed = 0, 0.0
    if state is not None:
        global_state, rows, start, elapsed = (
            state["global"],
            state["rows"],
            state["round"],
            state["elapsed"],
        )
        for client, cstate in zip(clients, state["clients"], strict=True):
            client.load_state(cstate)

    rounds = params["rounds"]
    label = "xcal " + "/".join(wildcards[k] for k in ("dataset", "model", "method", "shift"))
    progress = Progress(label, rounds, start=start)
    for r in range(start, rounds):
        t0 = time.perf_counter()
        updates = [c.train_round(net, wrapped, global_state) for c in clients]
        global_state = fedavg(updates)
        net.load_state_dict(global_state)
        scores = ev.scores()
        eps_spent = [u.ledger["epsilon"] for u in updates]
        cumulative = max(eps_spent) if private else None
        road_value = last_road = None
        if (r + 1) % params["road_every"] == 0 or r + 1 == rounds:
            last_road = ev.road()
            road_value = last_road["combined"]
        elapsed += time.perf_counter() - t0
        rows.append(
            {
                "round": r + 1,
                "f1": scores["f1"],
                "accuracy": scores["accuracy"],
                "epsilon": cumulative,
                "road": road_value,
                "seconds": elapsed,
            }
        )
        save_checkpoint(
            checkpoint_path,
            {
                "global": global_state,
                "rows": rows,
                "round": r + 1,
                "elapsed": elapsed,
                "clients": [c.state() for c in clients],
            },
        )
        progress.line(r + 1, {"f1": scores["f1"], "acc": scores["accuracy"]}, cumulative)

    metrics = _finish(out_dir, ev, clients, rows, last_road, params, wildcards, eps, spec)
    checkpoint_path.unlink(missing_ok=True)
    return metrics


def _finish(
    out_dir: Path,
    ev: xcal_eval.Evaluation,
    clients: list[Client],
    rows: list[dict],
    last_road: dict | None,
    params: dict,
    wildcards: dict[str, str],
    eps: float,
    spec: MethodSpec,
) -> dict:
    """Write rounds.csv, road.json, gradcam.npz, privacy.json and metrics.json."""
    frame = pd.DataFrame(rows, columns=["round", "f1", "accuracy", "epsilon", "road", "seconds"])
    write_csv(out_dir / "rounds.csv", frame)
    result = dict(last_road if last_road is not None else ev.road())  # final model's ROAD
    result["subsample"] = int(len(ev.road_idx))
    result["layer"] = ev.layer
    result["trajectory"] = [
        {"round": row["round"], "epsilon": row["epsilon"], "road": row["road"]}
        for row in rows
        if row["road"] is not None
    ]
    write_json(out_dir / "road.json", result)
    examples = ev.road_idx[:N_GRADCAM_EXAMPLES]
    maps, pred = xcal_eval.attributions(ev.module, ev.layer, ev.x[examples])
    write_npz(
        out_dir / "gradcam.npz",
        images=ev.x[examples].cpu().numpy().astype(np.float32),
        cams=maps.astype(np.float32),
        labels=ev.y[examples].cpu().numpy(),
        predictions=pred,
    )
    record = privacy_record(clients, spec, eps, params)
    record.write(out_dir / "privacy.json")
    steps = sum(c.stats.steps for c in clients)
    seconds = sum(c.stats.seconds for c in clients)
    sigmas = [s for c in clients for s in c.stats.sigmas]
    signals = [s for c in clients for s in c.stats.signals]
    last = rows[-1]
    metrics = {
        **{k: wildcards[k] for k in ("dataset", "model", "method", "shift", "clients", "eps")},
        "f1": last["f1"],
        "accuracy": last["accuracy"],
        "epsilon": record.epsilon,
        "road": result["combined"],
        "morf_mean": float(np.mean(result["morf"])),
        "lerf_mean": float(np.mean(result["lerf"])),
        "f1_per_eps": efficiency([r["f1"] for r in rows], [r["epsilon"] for r in rows]),
        "road_per_eps": efficiency([r["road"] for r in rows], [r["epsilon"] for r in rows]),
        "steps": steps,
        "step_seconds": seconds / steps if steps else None,
        "seconds": last["seconds"],
        "sigma_mean": float(np.mean(sigmas)) if sigmas else None,
        "sigma_min": float(np.min(sigmas)) if sigmas else None,
        "sigma_max": float(np.max(sigmas)) if sigmas else None,
        "signal_mean": float(np.mean(signals)) if signals else None,
        "halted_clients": sum(1 for c in clients if c.filter is not None and c.filter.halted),
        "gradcam_layer": ev.layer,
        "client_sizes": [c.n for c in clients],
    }
    write_json(out_dir / "metrics.json", metrics)
    return metrics
