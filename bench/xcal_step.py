"""Per-step time of XCal-FL's local training: non-private vs static DP-SGD vs XCal-FL.

For each model and method, one `Client` (the production code path of
`dpmed.xcal.client`) holds `--batch`·`--steps` random images of `--channels`×`--size`²
and trains rounds of Poisson-sampled steps of expected batch `--batch`; the median over `--reps`
rounds (methods interleaved, after one warm-up round) of the mean seconds per step and the
ratios are printed side by side. XCal's extra cost is the Grad-CAM pass (forward + backward to
the target layer) and the masked forward pass (paper §8: up to 80 % over static).

    PYTHONPATH=src python bench/xcal_step.py
    PYTHONPATH=src python bench/xcal_step.py --size 64 --width-scale 1.0 --batch 64 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch

from dpmed.models import build_model
from dpmed.models.classifiers import gradcam_layer
from dpmed.privacy.dpsgd import wrap_per_sample
from dpmed.runtime import select_device
from dpmed.xcal.client import Client, ClientSeeds
from dpmed.xcal.grid import MODELS
from dpmed.xcal.methods import BASELINE, NON_PRIVATE, PROPOSED, resolve

METHODS = (NON_PRIVATE, BASELINE, PROPOSED)


def make_client(model: str, method: str, args: argparse.Namespace):
    """(client, net, wrapper, global state) of one method on `model`, warmed up by one round."""
    device = select_device(args.device)
    torch.manual_seed(0)
    net = build_model(
        model,
        in_channels=args.channels,
        n_classes=8,
        image_size=args.size,
        width_scale=args.width_scale,
    ).to(device)
    layer = gradcam_layer(net, args.channels, args.size)
    trained = resolve(method, method != NON_PRIVATE, {"balanced": [1, 1, 1]})
    wrapped = wrap_per_sample(net, net.grad_sample_mode) if trained.dp else None
    x = torch.rand(args.n, args.channels, args.size, args.size, device=device)
    y = torch.randint(0, 8, (args.n,), device=device)
    params = {
        "rounds": args.reps + 1,
        "local_epochs": 1,
        "batch_size": args.batch,
        "lr": 0.01,
        "momentum": 0.9,
        "clip_norm": 1.0,
        "delta": 1e-5,
        "signal_fraction": 0.1,
        "band": 0.2,
        "top_q": 0.2,
        "ema": 0.9,
    }
    client = Client(0, x, y, trained, params, 8.0, ClientSeeds(0, 0, 1), layer)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    client.train_round(net, wrapped, state)  # warm-up
    return client, net, wrapped, state


def step_seconds(model: str, args: argparse.Namespace) -> dict[str, float]:
    """Median over `--reps` rounds of the mean seconds per step, methods interleaved round by
    round so that load from other processes hits every method alike."""
    setups = {m: make_client(model, m, args) for m in METHODS}
    samples: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(args.reps):
        for method, (client, net, wrapped, state) in setups.items():
            client.stats.steps, client.stats.seconds = 0, 0.0
            client.train_round(net, wrapped, state)
            samples[method].append(client.stats.seconds / max(1, client.stats.steps))
    return {m: statistics.median(v) for m, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--width-scale", type=float, default=0.25)
    parser.add_argument("--batch", type=int, default=32, help="expected batch size")
    parser.add_argument("--steps", type=int, default=4, help="expected steps per round")
    parser.add_argument("--reps", type=int, default=3, help="timed rounds per method")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    args.n = args.batch * args.steps
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    print(
        f"xcal step time: {args.channels}x{args.size}^2, expected batch {args.batch}, "
        f"width x{args.width_scale}, median of {args.reps} rounds of ~{args.steps} steps, "
        f"device {select_device(args.device)}"
    )
    header = (
        f"{'model':<16}{'nondp s':>10}{'static s':>10}{'xcal s':>10}"
        f"{'static/nondp':>14}{'xcal/nondp':>12}{'xcal/static':>13}"
    )
    print(header)
    for model in args.models:
        t = step_seconds(model, args)
        print(
            f"{model:<16}{t['nondp']:>10.4f}{t['static']:>10.4f}{t['xcal']:>10.4f}"
            f"{t['static'] / t['nondp']:>14.2f}{t['xcal'] / t['nondp']:>12.2f}"
            f"{t['xcal'] / t['static']:>13.2f}"
        )


if __name__ == "__main__":
    main()
