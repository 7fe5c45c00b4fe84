"""DP-SGD step cost of the seg models: time and peak memory as ratios to the non-private step.

For every model × clip rule × per-sample-gradient mode (hooks, functorch, ghost), one DP-SGD
step (forward, per-sample CE + Dice loss, backward, clipping, noise, Adam) on a batch of
`--batch` images of 1×`--size`×`--size` is compared with the non-private step (plain mean of
the same per-sample losses, no Opacus) of an identical copy of the model.

Time: the two steps alternate (`--warmup` + `--reps` pairs) and each keeps its fastest step,
so a ratio is measured under the same machine load. Memory: on CUDA
`torch.cuda.max_memory_allocated` above the allocation before the steps; on CPU each cell runs
in a fresh subprocess whose DP steps run first and report the peak RSS above the RSS before
them (the interpreter and torch are not counted); the non-private peak comes from its own
subprocess per model.

    PYTHONPATH=src python bench/dp_step.py                       # unet, unetpp, infnet
    PYTHONPATH=src python bench/dp_step.py --models lfunet --reps 10
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from dpmed.models import build_model, model_arguments
from dpmed.privacy.clipping import ClipRule, private_rules
from dpmed.privacy.dpsgd import GRAD_SAMPLE_MODES, ScaledPrivacyEngine
from dpmed.runtime import select_device
from dpmed.seg.losses import per_sample_loss


def _rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def _peak_mb(device: torch.device, base: float) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20 - base
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base


def _base_mb(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    return _rss_mb()


def _make_step(cell: dict, net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable:
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    if cell["rule"] == "none":
        module, optimizer, dp = net, opt, None
    else:
        engine = ScaledPrivacyEngine(ClipRule(cell["rule"]))
        dp = engine.make_private_poisson(
            net,
            opt,
            TensorDataset(x.cpu(), y.cpu()),
            sample_rate=1.0,
            noise_multiplier=1.0,
            grad_sample_mode=cell["mode"],
        )
        module, optimizer = dp.module, dp.optimizer

    def step() -> float:
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = per_sample_loss(module(x), y)
        if dp is None:
            loss.mean().backward()
        else:
            dp.backward(loss)
        optimizer.step()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    return step


def run_cell(cell: dict) -> dict:
    """Peak memory of the cell's step alone, then its time and the plain step's, alternating."""
    device = select_device(cell["device"])
    torch.manual_seed(0)
    torch.set_num_threads(cell["threads"])
    arguments = {"in_channels": 1, "n_classes": cell["classes"], "width": cell["width"],
                 "depth": cell["depth"], "deep_supervision": True}  # fmt: skip
    net = build_model(cell["model"], **model_arguments(cell["model"], arguments)).to(device)
    twin = copy.deepcopy(net)
    shape = (cell["batch"], 1, cell["size"], cell["size"])
    x = torch.randn(shape, device=device)
    y = torch.randint(
        0, cell["classes"], (cell["batch"], cell["size"], cell["size"]), device=device
    )
    step = _make_step(cell, net, x, y)
    base = _base_mb(device)
    for _ in range(2):
        step()
    peak = _peak_mb(device, base)
    result = {**cell, "peak_mb": peak}
    if cell["rule"] != "none":
        plain = _make_step({**cell, "rule": "none"}, twin, x, y)
        times, plain_times = [], []
        for _ in range(cell["warmup"] + cell["reps"]):
            plain_times.append(plain())
            times.append(step())
        result["ms"] = 1000 * min(times[cell["warmup"] :])
        result["plain_ms"] = 1000 * min(plain_times[cell["warmup"] :])
    return result


def measure(cell: dict) -> dict:
    """Run a cell in-process on CUDA, in a fresh subprocess on CPU (clean peak RSS)."""
    if select_device(cell["device"]).type == "cuda":
        return run_cell(cell)
    out = subprocess.run(
        [sys.executable, __file__, "--cell", json.dumps(cell)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["unet", "unetpp", "infnet"])
    parser.add_argument("--rules", nargs="+", default=list(private_rules()))
    parser.add_argument("--modes", nargs="+", default=list(GRAD_SAMPLE_MODES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(run_cell(json.loads(args.cell))))
        return
    keys = ("batch", "size", "width", "depth", "classes", "reps", "warmup", "threads", "device")
    common = {k: getattr(args, k) for k in keys}
    print(
        f"# DP-SGD step / non-private step (time: fastest of {args.reps}, alternating; memory: "
        f"peak above start); batch {args.batch} × 1×{args.size}×{args.size}, width {args.width}, "
        f"depth {args.depth}, {args.threads} thread(s), device {select_device(args.device)}"
    )
    print(
        f"{'model':8} {'rule':6} {'plain ms':>9} {'plain MB':>9} | "
        + " | ".join(f"{m + ' time×':>15} {m + ' mem×':>14}" for m in args.modes)
    )
    for model in args.models:
        plain = measure({**common, "model": model, "rule": "none", "mode": "none"})
        for rule in args.rules:
            parts, plain_ms = [], []
            for mode in args.modes:
                r = measure({**common, "model": model, "rule": rule, "mode": mode})
                plain_ms.append(r["plain_ms"])
                mem_ratio = r["peak_mb"] / max(plain["peak_mb"], 1e-9)
                parts.append(f"{r['ms'] / r['plain_ms']:>15.2f} {mem_ratio:>14.2f}")
            print(
                f"{model:8} {rule:6} {min(plain_ms):>9.1f} {plain['peak_mb']:>9.1f} | "
                + " | ".join(parts),
                flush=True,
            )


if __name__ == "__main__":
    main()
