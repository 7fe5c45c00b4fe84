"""Aggregation time per round for the paper's 33 M-parameter 3D residual U-Net, 6 collaborators,
CPU, against one in-memory pass over the same tensors.

    PYTHONPATH=src python bench/fets_aggregation.py [--repeats 7]

"one pass" = reading every local tensor of the round once (a single-threaded sum over each),
the floor any aggregator that looks at all tensors must pay; "noise draw" = drawing the d
Gaussian values one DP round adds with the server's noise generator (`dpmed.privacy.normals`:
numpy's ziggurat on a Philox stream per block) on the block threads into a reused array (the
DP modes themselves fill the noise block by block and never store it); "numpy normals" = the
same number of float32 normals from one numpy generator on one thread, for comparison.
Each aggregator runs through `Server.aggregate`, the code path of the simulation (weights
normalised, noise drawn, state rebuilt), in a process that keeps freed memory as the jobs do
(`dpmed.allocator`). Every timer runs once per repeat, round-robin, so that the machine's drift
reaches all of them alike; the medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from dpmed.allocator import keep_freed_memory
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


def interleaved(timers: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each timer, the timers run round-robin `repeats` times so that the
    machine's drift hits them all alike."""
    times: dict[str, list[float]] = {label: [] for label in timers}
    for _ in range(repeats):
        for label, fn in timers.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(ts) for label, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--collaborators", type=int, default=6)
    args = parser.parse_args()
    keep_freed_memory()  # as the simulation's process does (dpmed.runtime.JobContext.start)
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

    timers: dict[str, Callable[[], object]] = {"one pass (read all)": one_pass}
    source, numpy_rng = noise_generator(0), np.random.default_rng(0)
    noise, numpy_noise = (np.zeros(n_params, dtype=np.float32) for _ in range(2))  # reused
    timers["noise draw (d normals)"] = lambda: source.draw(n_params, np.float32).fill_all(noise)
    timers["numpy normals"] = lambda: numpy_rng.standard_normal(dtype=np.float32, out=numpy_noise)
    for aggregator, mode, eps in SETTINGS:
        server = Server(ServerConfig(aggregator, mode, eps, 1e-5, 100.0, "l2", "analytic", 0))
        timers[f"{aggregator}/{mode}"] = lambda s=server: s.aggregate(glob, local, 1)
    for fn in timers.values():  # warm-up: buffers touched
        fn()
    seconds = interleaved(timers, args.repeats)
    base = seconds["one pass (read all)"]
    print(
        f"model: {n_params / 1e6:.1f} M parameters, {len(glob)} tensors, "
        f"{args.collaborators} collaborators, float32, {args.repeats} interleaved repeats"
    )
    print(f"{'aggregator':<24}{'s/round':>10}{'x one pass':>12}")
    for label, value in seconds.items():
        print(f"{label:<24}{value:>10.3f}{value / base:>12.2f}")


if __name__ == "__main__":
    main()
