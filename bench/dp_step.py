"""DP-SGD step cost of every per-sample-gradient engine against the non-private step.

For each seg model (one DP-SGD step through the seg optimizer path: forward, per-sample CE +
Dice loss, backward, clipping by `--rule`, noise, Adam) and each xcal model at 28² and 64² (the
functional xcal step: forward, `clipped_grad_sum` with Opacus' flat factor, `noisy_step`, SGD
with momentum), the engines non-private, Opacus hooks, Opacus functorch, Opacus ghost (seg
only: the functional xcal front has no ghost mode) and book-keeping `bk` run on identical
copies of one network and one batch.

Time: the engines alternate step by step (`--warmup` + `--reps` rounds), so load from other
processes hits all of them alike; the median step per engine and its ratio to the non-private
median are printed. Absolute times on a shared machine are noisy, the ratios much less so.
Memory: on CUDA the peak `max_memory_allocated` of one step above the allocation before it; on
CPU the peak RSS of two steps above the RSS before them, each engine in a fresh subprocess.
The process keeps freed memory as every job does (`dpmed.allocator`); `--system-allocator`
measures with glibc's default instead, where each large CPU tensor is fresh, page-faulting
memory and the DP steps, which allocate more, pay the most for it.

Sizes: the paper's seg sizes (224² batch 8, Inf-Net 352² batch 24; width 32, depth 4) and the
xcal batch 64 at full width; `--quick` uses 64² batch 8 width 16 depth 3 for seg and batch 16
at width ×0.25 for xcal (CI size). The last two lines give the worst ratio of the engine that
`auto` picks per model (`AUTO_GRAD_SAMPLE_MODE` for seg, the model's `grad_sample_mode` for
xcal).

    PYTHONPATH=src python bench/dp_step.py --quick
    PYTHONPATH=src python bench/dp_step.py --device cuda
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from dpmed.allocator import keep_freed_memory
from dpmed.models import build_model, model_arguments
from dpmed.privacy.clipping import ClipRule
from dpmed.privacy.dpsgd import (
    ScaledPrivacyEngine,
    clipped_grad_sum,
    noisy_step,
    opacus_clip_factors,
    trainable,
    wrap_per_sample,
)
from dpmed.privacy.grad_sample_mode import resolve_grad_sample_mode
from dpmed.runtime import select_device
from dpmed.seg.losses import per_sample_loss

SEG_MODELS = ("unet", "unetpp", "lfunet", "infnet")
XCAL_MODELS = ("resnet18", "efficientnet_b0")
ENGINES = ("none", "hooks", "functorch", "ghost", "bk")
SEG_PAPER = {"unet": (224, 8), "unetpp": (224, 8), "lfunet": (224, 8), "infnet": (352, 24)}
SEG_PAPER_NET = {"width": 32, "depth": 4}
SEG_QUICK = (64, 8, {"width": 16, "depth": 3})
XCAL_SIZES = (28, 64)
XCAL_CLASSES = 8


def seg_cells(quick: bool, models: list[str]) -> list[dict]:
    cells = []
    for model in models:
        size, batch = SEG_QUICK[:2] if quick else SEG_PAPER[model]
        net = SEG_QUICK[2] if quick else SEG_PAPER_NET
        cells.append({"study": "seg", "model": model, "size": size, "batch": batch, **net})
    return cells


def xcal_cells(quick: bool, models: list[str]) -> list[dict]:
    batch, width_scale = (16, 0.25) if quick else (64, 1.0)
    return [
        {"study": "xcal", "model": m, "size": s, "batch": batch, "width_scale": width_scale}
        for m in models
        for s in XCAL_SIZES
    ]


def build(cell: dict, device: torch.device) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The cell's network (seeded) and one batch on `device`."""
    torch.manual_seed(0)
    b, s = cell["batch"], cell["size"]
    if cell["study"] == "seg":
        arguments = {"in_channels": 1, "n_classes": 2, "width": cell["width"],
                     "depth": cell["depth"], "deep_supervision": True}  # fmt: skip
        net = build_model(cell["model"], **model_arguments(cell["model"], arguments))
        x, y = torch.randn(b, 1, s, s), torch.randint(0, 2, (b, s, s))
    else:
        net = build_model(cell["model"], in_channels=3, n_classes=XCAL_CLASSES, image_size=s,
                          width_scale=cell["width_scale"])  # fmt: skip
        x, y = torch.rand(b, 3, s, s), torch.randint(0, XCAL_CLASSES, (b,))
    return net.to(device), x.to(device), y.to(device)


def auto_engine(cell: dict) -> str:
    """The engine `auto` picks: the seg table, or the xcal model class's attribute."""
    if cell["study"] == "seg":
        return resolve_grad_sample_mode("auto", cell["model"])
    net, _, _ = build({**cell, "batch": 1}, torch.device("cpu"))
    return net.grad_sample_mode


def seg_step(engine: str, net, x, y, rule: str) -> Callable[[], None]:
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    if engine == "none":

        def plain() -> None:
            optimizer.zero_grad()
            per_sample_loss(net(x), y).mean().backward()
            optimizer.step()

        return plain
    dp = ScaledPrivacyEngine(ClipRule(rule)).make_private_poisson(
        net,
        optimizer,
        TensorDataset(x.cpu(), y.cpu()),
        sample_rate=1.0,
        noise_multiplier=1.0,
        grad_sample_mode=engine,
    )

    def private() -> None:
        dp.optimizer.zero_grad()
        dp.backward(per_sample_loss(dp.module(x), y))
        dp.optimizer.step()

    return private


def xcal_step(engine: str, net, x, y) -> Callable[[], None] | None:
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    if engine == "none":

        def plain() -> None:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            optimizer.step()

        return plain
    if engine == "ghost":
        return None
    wrapped = wrap_per_sample(net, engine)
    std = {name: 1.0 for name in trainable(wrapped)}
    generator = torch.Generator(device=x.device).manual_seed(0)

    def private() -> None:
        sums, _ = clipped_grad_sum(wrapped, x, y, lambda n: opacus_clip_factors(n, 1.0))
        noisy_step(wrapped, optimizer, sums, std, float(len(x)), generator)

    return private


def make_step(cell: dict, engine: str, net, x, y, rule: str) -> Callable[[], None] | None:
    if cell["study"] == "seg":
        return seg_step(engine, net, x, y, rule)
    return xcal_step(engine, net, x, y)


def timed(step: Callable[[], None], device: torch.device) -> float:
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def cuda_peak_mb(step: Callable[[], None]) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def cpu_peak_mb(cell: dict, engine: str, rule: str, system_allocator: bool) -> float:
    """Peak RSS of two steps above the RSS before them, in a fresh interpreter."""
    spec = json.dumps({"cell": cell, "engine": engine, "rule": rule})
    extra = ["--system-allocator"] if system_allocator else []
    out = subprocess.run(
        [sys.executable, __file__, "--memory-cell", spec, *extra], capture_output=True, text=True
    )
    if out.returncode:
        return float("nan")
    return float(out.stdout.strip().splitlines()[-1])


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def memory_cell(spec: dict) -> float:
    """Peak RSS (VmHWM, reset through /proc/self/clear_refs) of two steps above the RSS before
    them: what the steps allocate, without the interpreter and the imports."""
    torch.set_num_threads(1)
    net, x, y = build(spec["cell"], torch.device("cpu"))
    step = make_step(spec["cell"], spec["engine"], net, x, y, spec["rule"])
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak to the current RSS
    base = _status_mb("VmRSS")
    for _ in range(2):
        step()
    return _status_mb("VmHWM") - base


def measure(cell: dict, args: argparse.Namespace, device: torch.device) -> dict[str, dict]:
    """Median step time and peak memory per engine, engines interleaved step by step."""
    net, x, y = build(cell, device)
    steps = {}
    for engine in args.engines:
        step = make_step(cell, engine, copy.deepcopy(net), x, y, args.rule)
        if step is not None:
            steps[engine] = step
    times: dict[str, list[float]] = {engine: [] for engine in steps}
    for round_ in range(args.warmup + args.reps):
        for engine, step in steps.items():
            seconds = timed(step, device)
            if round_ >= args.warmup:
                times[engine].append(seconds)
    out = {}
    for engine, step in steps.items():
        if not args.memory:
            peak = float("nan")
        elif device.type == "cuda":
            peak = cuda_peak_mb(step)
        else:
            peak = cpu_peak_mb(cell, engine, args.rule, args.system_allocator)
        out[engine] = {"ms": 1000 * statistics.median(times[engine]), "peak_mb": peak}
    return out


def describe(cell: dict) -> str:
    if cell["study"] == "seg":
        return (f"{cell['model']} {cell['size']}² b{cell['batch']} w{cell['width']} "
                f"d{cell['depth']}")  # fmt: skip
    return f"{cell['model']} {cell['size']}² b{cell['batch']} ×{cell['width_scale']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI sizes (module docstring)")
    parser.add_argument("--seg-models", nargs="*", default=list(SEG_MODELS))
    parser.add_argument("--xcal-models", nargs="*", default=list(XCAL_MODELS))
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--rule", default="flat", help="seg clip rule (cost is rule-free)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-memory", dest="memory", action="store_false")
    parser.add_argument(
        "--system-allocator", action="store_true", help="glibc's default, not the jobs' allocator"
    )
    parser.add_argument("--memory-cell", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    if not args.system_allocator:
        keep_freed_memory()
    if args.memory_cell:
        print(memory_cell(json.loads(args.memory_cell)))
        return
    if "none" not in args.engines:
        parser.error("--engines must include none (the ratios' denominator)")
    torch.set_num_threads(args.threads)
    device = select_device(args.device)
    print(
        f"# step time: median of {args.reps} interleaved rounds after {args.warmup} warm-up; "
        f"×: over the non-private median; memory: peak above start; seg rule {args.rule}; "
        f"{args.threads} thread(s); device {device}; {'quick' if args.quick else 'paper'} sizes; "
        f"allocator {'glibc default' if args.system_allocator else 'keeps freed memory (jobs)'}"
    )
    print(f"{'cell':34} {'engine':10} {'ms':>9} {'time×':>7} {'peak MB':>9} {'mem×':>6}")
    worst: dict[str, list[tuple[float, str]]] = {"seg": [], "xcal": []}
    cells = seg_cells(args.quick, args.seg_models) + xcal_cells(args.quick, args.xcal_models)
    for cell in cells:
        result = measure(cell, args, device)
        plain = result["none"]
        picked = auto_engine(cell)
        for engine, r in result.items():
            mark = " (auto)" if engine == picked else ""
            print(
                f"{describe(cell):34} {engine:10} {r['ms']:>9.1f} {r['ms'] / plain['ms']:>7.2f} "
                f"{r['peak_mb']:>9.1f} {r['peak_mb'] / max(plain['peak_mb'], 1e-9):>6.2f}{mark}",
                flush=True,
            )
        if picked in result:
            worst[cell["study"]].append((result[picked]["ms"] / plain["ms"], picked))
    for study in ("seg", "xcal"):
        ratios = worst[study]
        engines = "/".join(sorted({engine for _, engine in ratios})) or "none"
        value = max((ratio for ratio, _ in ratios), default=float("nan"))
        print(f"worst {study} DP/non-private step ratio ({engines}): {value:.2f}")


if __name__ == "__main__":
    main()
