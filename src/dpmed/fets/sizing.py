"""The fets study's sizing (`dpmed.sizing`): what a training job holds and repeats, and which
jobs one preflight probe measures. Torch-free at import (the workflow reads it).

Work of one job: R · c · ⌈local_epochs · n̄_train · patches/B⌉ training steps, with c =
⌊ρ·P⌋ collaborators per round (P partitions) holding the mean training subjects n̄_train of
the partitions; R · c updates aggregated by the server; (R + 1) · Σ_p n_val,p validated
volumes (every collaborator validates every round, round 0 included).

A distinct cell keeps the aggregator and DP mode (the server's rule), the participation (how
many updates the server holds), private or not, the network (base filters, depth, norm),
patch and batch size; it drops seed, ε0 and rounds. The collaborators' training and
validation depend only on the network, patch and batch size (`shared_key`): every cell of one
network shares that part of the probe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpmed.config.wildcards import parse_eps
from dpmed.data.registry import DATASET_REGISTRY
from dpmed.fets.grid import aggregator_name
from dpmed.sizing import RuleSizing, StudySizing, Work, picked

MB = 1e6
FLOAT = 4  # bytes of a float32
COLLABORATOR = ("base_filters", "depth", "norm", "patch_size", "batch_size")
NETWORK = (*COLLABORATOR, "participation")


def partitions(data: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """(training, validation) subjects of the partitions (val = max(1, round(f·n)))."""
    from dpmed.data.splits import split_counts
    from dpmed.data.synthetic.fets import partition_sizes

    fets = data["fets"]
    sizes = partition_sizes(float(fets["synthetic"]["subjects_scale"]))
    fraction = float(fets["val_fraction"])
    splits = [split_counts(n, [1 - fraction, fraction]) for n in sizes]
    return [s[0] for s in splits], [s[1] for s in splits]


def collaborators_per_round(data: Mapping[str, Any], hp: Mapping[str, Any]) -> int:
    """The collaborators a round chooses: ⌊participation × partitions⌋, at least one."""
    from dpmed.data.synthetic.fets import partition_sizes
    from dpmed.fets.selection import per_round

    subjects_scale = float(data["fets"]["synthetic"]["subjects_scale"])
    return per_round(len(partition_sizes(subjects_scale)), float(hp["participation"]))


def _parameters(hp: Mapping[str, Any]) -> int:
    from dpmed.models import parameter_count

    entry = DATASET_REGISTRY["fets"]
    return parameter_count("resunet3d", in_channels=entry.channels, n_classes=entry.n_classes,
                           base_filters=hp["base_filters"], depth=hp["depth"],
                           norm=hp["norm"])  # fmt: skip


def train_memory(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> dict[str, float]:
    """Memory features of a training job."""
    chosen = collaborators_per_round(data, hp)
    patch = math.prod(hp["patch_size"])
    volume = math.prod(data["fets"]["synthetic"]["shape"])
    params = _parameters(hp)
    channels = DATASET_REGISTRY["fets"].channels
    return {
        "const": 1.0,
        "act_patch": hp["batch_size"] * patch * hp["base_filters"] / MB,
        "act_volume": volume * hp["base_filters"] / MB,  # sliding-window validation
        # every chosen collaborator's update and the server's states (float64), one subject
        "host": (chosen + 6) * params * 8 / MB + volume * (channels + 1) * FLOAT / MB,
        "device": 4 * params * FLOAT / MB,  # weights, gradient, two optimiser moments
    }


def train_work(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> dict[str, Work]:
    """Training steps, aggregated updates and validated volumes of a job (module docstring)."""
    train, val = partitions(data)
    rounds, batch = int(hp["rounds"]), int(hp["batch_size"])
    chosen = collaborators_per_round(data, hp)
    patches = float(hp["local_epochs"]) * sum(train) / len(train) * int(hp["patches_per_subject"])
    f2 = hp["base_filters"] ** 2 / 1e9  # convolution work grows with voxels × filters²
    patch = math.prod(hp["patch_size"])
    volume = math.prod(data["fets"]["synthetic"]["shape"])
    return {
        "step": Work(rounds * chosen * math.ceil(patches / batch), batch * patch * f2, "train",
                     "seconds_per_step"),
        # the probe times one aggregate of `updates` updates; it is linear in their number
        "update": Work(rounds * chosen, _parameters(hp) / MB, "aggregate", "aggregate_seconds",
                       per="updates"),
        "volume": Work((rounds + 1) * sum(val), volume * f2, "val", "val_seconds_per_volume"),
    }  # fmt: skip


def shape_key(wc: Mapping[str, str], params: Mapping[str, Any]) -> tuple:
    """(aggregator, DP mode, private, network and participation)."""
    private = math.isfinite(parse_eps(wc["eps"]))
    return (aggregator_name(wc["aggregator"]), wc["dpmode"], private, picked(params, NETWORK))


def shared_key(wc: Mapping[str, str], params: Mapping[str, Any]) -> tuple:
    """What a collaborator's training and validation depend on: the network, patch and batch
    size (not the server's rule, its DP mode, ε0 or the participation)."""
    return picked(params, COLLABORATOR)


def cost_features(key: tuple, params: Mapping[str, Any]) -> tuple:
    """The collaborators' network, the participation, private or not, then the server's rule."""
    aggregator, dpmode, private, _ = key
    return (shared_key({}, params), picked(params, ("participation",)), private, aggregator,
            dpmode)  # fmt: skip


def sample_features(key: tuple, wc: Mapping[str, str]) -> list[str]:
    """The aggregator, DP mode and network of a job."""
    return [f"aggregator={key[0]}", f"dpmode={wc['dpmode']}", "model=resunet3d"]


SIZING = StudySizing(
    rules={"fets_train": RuleSizing(train_memory, train_work, "step")},
    shape_key=shape_key,
    probe_key=lambda key: key,
    cost_features=cost_features,
    sample_features=sample_features,
    shared_key=shared_key,
)
