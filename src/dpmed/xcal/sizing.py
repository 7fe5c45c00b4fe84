"""The xcal study's sizing (`dpmed.sizing`): what a training job holds and repeats, and which
jobs one preflight probe measures. Torch-free at import (the workflow reads it).

Work of one job: R · m · ⌈N/(K·B)⌉ · local_epochs local steps, with m = min(clients_per_round,
K) clients per round each holding N/K images on average; R · m client rounds (a client's
per-round work outside its steps: the signal, FedAvg; priced per method family, whose signals
differ); R test evaluations; ⌈R/road_every⌉ + 1 ROADs (the last the random-saliency
baseline's, once per run).

A distinct cell keeps the dataset, model and width, method (its step and noise code), shift,
client count (the data each client holds), private or not and batch size; it drops seed, ε
and rounds. The XCal-FL presets (weights of the same signal components), the shift and the
client count (they partition the data without changing one client's step) share one probe,
and the test evaluation and ROAD depend only on the dataset, network and ROAD settings
(`shared_key`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpmed.config.wildcards import parse_eps
from dpmed.data.registry import DATASET_REGISTRY
from dpmed.sizing import RuleSizing, StudySizing, Work, frozen, picked
from dpmed.xcal.methods import split_method

MB = 1e6
FLOAT = 4  # bytes of a float32
NETWORK = ("width_scale", "batch_size", "clients_per_round")
AXES = ("dataset", "model", "method", "shift", "clients")


def _parameters(data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]) -> int:
    from dpmed.models import parameter_count

    entry = DATASET_REGISTRY[wc["dataset"]]
    return parameter_count(wc["model"], in_channels=entry.channels, n_classes=entry.n_classes,
                           width_scale=hp["width_scale"],
                           image_size=data[wc["dataset"]]["size"])  # fmt: skip


def train_memory(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> dict[str, float]:
    """Memory features of a training job."""
    size, counts = data[wc["dataset"]]["size"], data[wc["dataset"]]["synthetic"]["counts"]
    pixels = size**2
    params = _parameters(data, wc, hp)
    batch, clients = hp["batch_size"], int(wc["clients"])
    private = wc["method"] != "nondp"
    channels = DATASET_REGISTRY[wc["dataset"]].channels
    return {
        "const": 1.0,
        f"act_{wc['model']}": batch * pixels * hp["width_scale"] / MB,
        # the images (float32) and every client's model state
        "host": (sum(counts) * pixels * channels + 2 * clients * params) * FLOAT / MB,
        # per-sample gradients and their clipped copy, weights, gradient, momentum
        "device": ((2 * batch if private else 0) + 4) * params * FLOAT / MB,
    }


def train_work(
    data: Mapping[str, Any], wc: Mapping[str, str], hp: Mapping[str, Any]
) -> dict[str, Work]:
    """Local steps, client rounds, evaluations and ROADs of a job (module docstring)."""
    n, _, n_test = (int(c) for c in data[wc["dataset"]]["synthetic"]["counts"])
    clients, rounds, batch = int(wc["clients"]), int(hp["rounds"]), int(hp["batch_size"])
    per_round = min(int(hp["clients_per_round"]), clients)
    steps = rounds * per_round * int(hp["local_epochs"]) * math.ceil(n / clients / batch)
    image = data[wc["dataset"]]["size"] ** 2 * hp["width_scale"] ** 2 / 1e9  # pixels × width²
    road = hp["road_subsample"] * len(hp["road_percentages"]) * image
    term, family = f"work_{wc['model']}", split_method(wc["method"])[0]
    return {
        "step": Work(steps, batch * image, term, "seconds_per_step"),
        "client_round": Work(rounds * per_round, _parameters(data, wc, hp) / MB, f"round_{family}",
                             "round_overhead_seconds"),
        "evaluation": Work(rounds, n_test * image, term, "eval_seconds"),
        "road": Work(math.ceil(rounds / int(hp["road_every"])) + 1, road, "road", "road_seconds"),
    }  # fmt: skip


def shape_key(wc: Mapping[str, str], params: Mapping[str, Any]) -> tuple:
    """(dataset, model, method, shift, clients, private, network)."""
    private = math.isfinite(parse_eps(wc["eps"]))
    return (*(wc[k] for k in AXES), private, picked(params, NETWORK))


def probe_key(key: tuple) -> tuple:
    """The shape key with the XCal-FL preset, the shift and the client count dropped."""
    dataset, model, method, _, _, private, net = key
    return (dataset, model, split_method(method)[0], private, net)


def shared_key(wc: Mapping[str, str], params: Mapping[str, Any]) -> tuple:
    """What the test evaluation and ROAD depend on: the dataset (its test set), the network and
    the ROAD settings; not the method, shift, clients or ε (they change the weights, not the
    work of a forward pass or of Grad-CAM)."""
    return (wc["dataset"], wc["model"], frozen(params["width_scale"]),
            frozen(params["road_subsample"]), frozen(params["road_percentages"]))  # fmt: skip


def cost_features(key: tuple, params: Mapping[str, Any]) -> tuple:
    """Input and network, private or not, then the method, clients and shift."""
    dataset, model, method, shift, clients, private, net = key
    return (dataset, model, net, private, method, clients, shift)


def sample_features(key: tuple, wc: Mapping[str, str]) -> list[str]:
    """The method and model of a job."""
    return [f"method={wc['method']}", f"model={wc['model']}"]


SIZING = StudySizing(
    rules={"xcal_train": RuleSizing(train_memory, train_work, "step")},
    shape_key=shape_key,
    probe_key=probe_key,
    cost_features=cost_features,
    sample_features=sample_features,
    shared_key=shared_key,
)
