"""Projected cost of every job of a grid: the job's own step counts (from its params and the
configured data sizes) × the seconds its cell's probe measured.

Per job (seconds, on the device the probe ran on):

- seg_train: epochs · S · t_step + ((epochs + 1) · ⌈N_val/B⌉ + ⌈N_test/B⌉) · t_eval, with
  S = ⌊1/q⌋ sampled batches per epoch (private, q = min(1, B/N_train)) or ⌈N_train/B⌉ (as
  `dpmed.seg.run.Plan`); validation after every epoch and at the end, the test split once
  (its HD95 is not timed).
- seg_attack: 2n images scored in batches of the attack's size, n = min(N_train, N_val+N_test)
  members and as many non-members (`dpmed.seg.attack`).
- xcal_train: R · m · ⌈N/(K·B)⌉ · local_epochs · t_step + R · (m · t_round + t_eval)
  + (⌈R/road_every⌉ + 1) · t_road, with m = min(clients_per_round, K) clients per round each
  holding N/K images on average, t_round its per-round work outside the steps (the signal,
  FedAvg); the last ROAD is the random-saliency baseline's, once per run.
- fets_train: R · c · ⌈local_epochs · n̄_train · patches/B⌉ · t_step
  + R · t_aggregate · c/c_probe + (R + 1) · Σ_p n_val,p · t_volume, with c = ⌊ρ·33⌋
  collaborators per round holding the mean training subjects n̄_train of the 33 partitions
  (t_aggregate was timed on c_probe updates, the probe's `updates`); every collaborator
  validates every round (round 0 included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpmed.config.wildcards import parse_eps
from dpmed.data.splits import split_counts
from dpmed.data.synthetic.fets import partition_sizes
from dpmed.job_cost import FETS_PARTITIONS
from dpmed.preflight.data import seg_counts


def seg_train_seconds(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any], m: Mapping[str, float]
) -> tuple[int, float]:
    """(training steps, seconds) of one seg job."""
    n_train, n_val, n_test = seg_counts(data[wc["dataset"]], wc["dataset"])
    batch, epochs = int(hp["batch_size"]), int(hp["epochs"])
    private = math.isfinite(parse_eps(wc["eps"])) and wc["clip"] != "none"
    q = min(1.0, batch / n_train)
    per_epoch = int(1 / q) if private else math.ceil(n_train / batch)
    steps = epochs * per_epoch
    eval_batches = (epochs + 1) * math.ceil(n_val / batch) + math.ceil(n_test / batch)
    return steps, steps * m["seconds_per_step"] + eval_batches * m["eval_seconds_per_batch"]


def seg_attack_seconds(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any], m: Mapping[str, float]
) -> tuple[int, float]:
    """(scoring batches, seconds) of one seg attack job."""
    n_train, n_val, n_test = seg_counts(data[wc["dataset"]], wc["dataset"])
    images = 2 * min(n_train, n_val + n_test)
    batches = math.ceil(images / int(m["attack_batch"]))
    return batches, batches * m["attack_seconds_per_batch"]


def xcal_train_seconds(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any], m: Mapping[str, float]
) -> tuple[int, float]:
    """(local steps of all clients, seconds) of one xcal job."""
    n = int(data[wc["dataset"]]["synthetic"]["counts"][0])
    clients, rounds = int(wc["clients"]), int(hp["rounds"])
    per_round = min(int(hp["clients_per_round"]), clients)
    steps = rounds * per_round * int(hp["local_epochs"]) * math.ceil(n / clients / hp["batch_size"])
    road_rounds = math.ceil(rounds / int(hp["road_every"]))
    seconds = (steps * m["seconds_per_step"]
               + rounds * (per_round * m["round_overhead_seconds"] + m["eval_seconds"])
               + (road_rounds + 1) * m["road_seconds"])  # fmt: skip
    return steps, seconds


def fets_partitions(data: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """(training, validation) subjects of the 33 partitions (val = max(1, round(f·n)))."""
    fets = data["fets"]
    sizes = partition_sizes(float(fets["synthetic"]["subjects_scale"]))
    fraction = float(fets["val_fraction"])
    splits = [split_counts(n, [1 - fraction, fraction]) for n in sizes]
    return [s[0] for s in splits], [s[1] for s in splits]


def fets_train_seconds(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any], m: Mapping[str, float]
) -> tuple[int, float]:
    """(training steps of all collaborators, seconds) of one fets job."""
    train, val = fets_partitions(data)
    rounds = int(hp["rounds"])
    chosen = max(1, math.floor(float(hp["participation"]) * FETS_PARTITIONS + 1e-9))
    mean_train = sum(train) / len(train)
    patches = float(hp["local_epochs"]) * mean_train * int(hp["patches_per_subject"])
    steps = rounds * chosen * math.ceil(patches / int(hp["batch_size"]))
    # the aggregate is linear in the updates it holds (the probe's count may differ)
    aggregate = m["aggregate_seconds"] * chosen / m.get("updates", chosen)
    seconds = (steps * m["seconds_per_step"] + rounds * aggregate
               + (rounds + 1) * sum(val) * m["val_seconds_per_volume"])  # fmt: skip
    return steps, seconds


RULE_COST = {
    "seg_train": seg_train_seconds,
    "seg_attack": seg_attack_seconds,
    "xcal_train": xcal_train_seconds,
    "fets_train": fets_train_seconds,
}
