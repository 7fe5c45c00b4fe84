"""Aggregation time per round for the paper's 33 M-parameter 3D residual U-Net, 6 collaborators,
CPU, against one in-memory pass over the same tensors.

    PYTHONPATH=src python bench/fets_aggregation.py [--repeats 3]

"one pass" = reading every local tensor of the round once (a sum over each), the floor any
aggregator that looks at all tensors must pay; "noise draw" = drawing the d Gaussian values one
DP round adds with the server's noise generator (`dpmed.privacy.normals`), the floor of any DP
aggregator on top of its passes; "numpy normals" = the same draw with numpy's float32 ziggurat,
for comparison. Each aggregator runs through `Server.aggregate`,
the code path of the simulation (weights normalised, noise drawn, state rebuilt).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from dpmed.fets.aggregation import AGGREGATORS, DP_MODES
from dpmed.fets.collaborator import state_to_numpy
from dpmed.fets.server import Server, ServerConfig, noise_generator
from dpmed.models import build_model
from dpmed.models.resunet3d import count_parameters

# Every registered (aggregator, DP mode), private ones at eps0 = 1.
SETTINGS = [
    (name, mode, 1.0 if DP_MODES[mode].private else None)
    for name, entry in AGGREGATORS.items()
    for mode in entry.modes
]


def _time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--collaborators", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model("resunet3d", in_channels=4, n_classes=4, base_filters=32, depth=4)
    n_params = count_parameters(model)
    glob = state_to_numpy(model)
    rng = np.random.default_rng(0)
    local = [
        (str(i), {k: v + 1e-3 * rng.standard_normal(v.shape, dtype=np.float32)
                  for k, v in glob.items()}, float(10 + i))
        for i in range(args.collaborators)
    ]  # fmt: skip
    del model

    def one_pass() -> float:
        return float(sum(np.add.reduce(t, axis=None) for _, s, _ in local for t in s.values()))

    base = _time(one_pass, args.repeats)
    print(
        f"model: {n_params / 1e6:.1f} M parameters, {len(glob)} tensors, "
        f"{args.collaborators} collaborators, float32"
    )
    print(f"{'aggregator':<24}{'s/round':>10}{'x one pass':>12}")
    print(f"{'one pass (read all)':<24}{base:>10.3f}{1.0:>12.2f}")
    source, numpy_rng = noise_generator(0), np.random.default_rng(0)
    for label, rng in (("noise draw (d normals)", source), ("numpy normals", numpy_rng)):
        noise = _time(lambda rng=rng: rng.standard_normal(n_params, dtype=np.float32),
                      args.repeats)  # fmt: skip
        print(f"{label:<24}{noise:>10.3f}{noise / base:>12.2f}")
    for aggregator, mode, eps in SETTINGS:
        server = Server(ServerConfig(aggregator, mode, eps, 1e-5, 100.0, "l2", "analytic", 0))
        seconds = _time(lambda server=server: server.aggregate(glob, local, 1), args.repeats)
        print(f"{aggregator + '/' + mode:<24}{seconds:>10.3f}{seconds / base:>12.2f}")


if __name__ == "__main__":
    main()
