"""The in-process, deterministic FeTS federation of one run (paper 000 §III-B/C).

Per round r = 1..T: the selection schedule names the trainers; each trains locally from the
broadcast global model and sends (tensors, n_train); the server aggregates (it never holds a
collaborator object); every collaborator validates the new global model on its own validation
subjects and returns scores; the FeTS timing model gives the round's simulated time and the
projected convergence score advances. Round 0 is the untrained model's validation.

Every round ends with an atomic checkpoint (global model, rows, score state, resource totals);
a rerun with the same settings resumes after the last completed round and, because every random
draw is seeded from (seed, round, collaborator), produces the same results as an uninterrupted
run. Outputs in `out_dir`: rounds.csv (one row per round: chosen, round and cumulative
simulated seconds, Dice, convergence score, privacy columns of `ledger`), selection.csv (one
row per chosen collaborator and round, with its simulated seconds), metrics.json,
privacy.json, resources.json (checkpoint.pt stays as the final model).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dpmed.config.wildcards import parse_eps
from dpmed.data import fets
from dpmed.fets import privacy as ledger
from dpmed.fets import selection, timing
from dpmed.fets.brats import DICE_KEYS, LABEL_VALUES
from dpmed.fets.collaborator import Collaborator, LocalTraining, state_to_numpy
from dpmed.fets.resources import ResourceMeter, Totals
from dpmed.fets.server import Server, ServerConfig
from dpmed.io import write_csv, write_json
from dpmed.models.resunet3d import ResUNet3d, count_parameters
from dpmed.runtime import Progress, load_checkpoint, save_checkpoint, seed_everything, select_device
from dpmed.seeding import stable_seed

CHECKPOINT = "checkpoint.pt"


def build_resunet(params: dict[str, Any]) -> ResUNet3d:
    """The run's 3D residual U-Net (4 modalities in, 4 classes out)."""
    return ResUNet3d(4, len(LABEL_VALUES), int(params["base_filters"]), int(params["depth"]),
                     params["norm"])  # fmt: skip


def _fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _validate(collabs: list[Collaborator], state: dict[str, np.ndarray]) -> dict[str, float]:
    """Mean over all validation subjects of all collaborators (each validates locally)."""
    scores = [s for col in collabs for s in col.validate(state)]
    out = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
    out["dice_mean_labels"] = float(np.mean([out[f"dice_label{v}"] for v in LABEL_VALUES]))
    return out


def run(
    processed_dir: str | Path,
    out_dir: str | Path,
    wildcards: dict[str, str],
    params: dict[str, Any],
    seed: int,
    device: str = "auto",
    threads: int | None = None,
) -> dict[str, Any]:
    """Run (or resume) one fets job; returns metrics.json's content."""
    processed_dir, out_dir = Path(processed_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(seed, threads)
    dev = select_device(device)
    eps0 = parse_eps(wildcards["eps"])
    cfg = ServerConfig(
        aggregator=wildcards["aggregator"],
        dpmode=wildcards["dpmode"],
        epsilon0=None if math.isinf(eps0) else float(eps0),
        delta0=float(params["delta"]),
        clip_norm=float(params["clip_norm"]),
        simagg_distance=params["simagg_distance"],
        sound_calibration=params["sound_calibration"],
        seed=seed,
    )
    spec = LocalTraining(
        local_epochs=float(params["local_epochs"]),
        lr=float(params["lr"]),
        batch_size=int(params["batch_size"]),
        patch_size=tuple(int(p) for p in params["patch_size"]),
        patches_per_subject=int(params["patches_per_subject"]),
        hd95=bool(params["hd95"]),
    )
    rounds = int(params["rounds"])
    torch.manual_seed(seed)
    model = build_resunet(params)
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise ValueError(f"model has buffers {buffers}: no aggregation rule covers them")
    workspace = build_resunet(params).to(dev)
    collabs = [
        Collaborator(str(c.partition_id), processed_dir, c.train, c.val, spec, workspace, dev)
        for c in fets.collaborators(processed_dir)
    ]
    names = [c.name for c in collabs]
    choices = selection.schedule(
        [int(n) for n in names], float(params["participation"]), rounds, params["selection"], seed
    )
    profiles = timing.time_profiles(names)
    sizes = {c.name: (c.n_train, c.n_val) for c in collabs}
    server = Server(cfg)
    by_name = dict(zip(names, collabs, strict=True))

    settings = {"wildcards": wildcards, "params": params, "seed": seed}
    fingerprint = _fingerprint(settings)
    ckpt = load_checkpoint(out_dir / CHECKPOINT)
    if ckpt is not None and ckpt["fingerprint"] == fingerprint:
        done, state, rows, col_times = ckpt["round"], ckpt["state"], ckpt["rows"], ckpt["times"]
        score = timing.ConvergenceScore(**ckpt["score"])
        meter = ResourceMeter(dev, Totals(**ckpt["totals"]))
        print(f"resuming after round {done} from {out_dir / CHECKPOINT}", flush=True)
    else:
        if ckpt is not None:
            print("checkpoint was made with other settings: starting afresh", flush=True)
        done, state, col_times = 0, state_to_numpy(model), {}
        score, meter = timing.ConvergenceScore(), ResourceMeter(dev)
        rows = [{"round": 0, "chosen": "", "round_time_s": 0.0, "sim_time_s": 0.0,
                 **_validate(collabs, state), "convergence_score": 0.0,
                 **ledger.round_columns(cfg, 0, None)}]  # fmt: skip
    label = "fets/{aggregator}/{dpmode}/eps{eps}".format(**wildcards)
    progress = Progress(label, rounds, start=done)
    for r in range(done + 1, rounds + 1):
        chosen = [str(c) for c in choices[r - 1].collaborators]
        local = []
        for name in chosen:
            local_state, weight = by_name[name].train(
                state, stable_seed("fets-local", seed, r, name)
            )
            local.append((name, local_state, weight))
        state, mech = server.aggregate(state, local, r)
        del local
        times = timing.round_times(profiles, sizes, chosen, spec.local_epochs, r - 1)
        round_time = max(times.values())
        col_times.update({(r, int(name)): t for name, t in times.items() if name in chosen})
        val = _validate(collabs, state)
        projected = score.update(val["dice_mean_labels"], round_time)
        rows.append({"round": r, "chosen": ";".join(chosen), "round_time_s": round_time,
                     "sim_time_s": score.total_time, **val, "convergence_score": projected,
                     **ledger.round_columns(cfg, r, mech)})  # fmt: skip
        save_checkpoint(out_dir / CHECKPOINT, {
            "fingerprint": fingerprint, "round": r, "state": state, "rows": rows,
            "score": asdict(score), "totals": asdict(meter.snapshot()), "times": col_times,
        })  # fmt: skip
        eps_now = None if mech is None else rows[-1]["eps_basic_cum"]
        progress.line(r, {"WT": val["dice_WT"], "dice": val["dice_mean_labels"],
                          "score": projected}, eps_now)  # fmt: skip
    return _write_outputs(out_dir, cfg, rows, choices, col_times, meter, model, params, wildcards)


def _write_outputs(out_dir, cfg, rows, choices, col_times, meter, model, params, wildcards):
    """Write the run's five output files; returns metrics.json's content."""
    frame = pd.DataFrame(rows)
    write_csv(out_dir / "rounds.csv", frame)
    chosen = selection.selection_frame(choices)
    chosen["sim_time_s"] = [col_times[(r, c)] for r, c in zip(chosen["round"],
                            chosen["collaborator"], strict=True)]  # fmt: skip
    write_csv(out_dir / "selection.csv", chosen)
    last = rows[-1]
    rounds = int(params["rounds"])
    priv = ledger.privacy_record(cfg, rounds, last if cfg.dpmode != "none" else None, cfg.clip_norm)
    priv.write(out_dir / "privacy.json")
    resources = meter.report(float(last["sim_time_s"]))
    write_json(out_dir / "resources.json", resources)
    metrics = {
        **{k: last[k] for k in (*DICE_KEYS, "dice_mean_labels")},
        **{k: v for k, v in last.items() if k.startswith("hd95_")},
        "dice_WT_round0": rows[0]["dice_WT"],
        "dice_mean_labels_round0": rows[0]["dice_mean_labels"],
        "best_dice_mean_labels": max(r["dice_mean_labels"] for r in rows),
        "convergence_score": last["convergence_score"],
        "sim_time_s": last["sim_time_s"],
        "rounds": rounds,
        "n_parameters": count_parameters(model),
        "aggregator": cfg.aggregator,
        "dpmode": cfg.dpmode,
        "eps0": wildcards["eps"],
        "seed_wildcard": wildcards["seed"],
        "epsilon": priv.epsilon,
        "guarantee": priv.guarantee,
    }
    write_json(out_dir / "metrics.json", metrics)
    return metrics
