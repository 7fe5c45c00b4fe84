"""The server aggregation's share of a fets round's wall time at the paper's size, CPU: the
32.2 M-parameter 3D residual U-Net of `config/config.yaml` `fets.defaults`, 6 collaborators
(participation 0.2) and 33 (the sweep's participation 1.0).

    PYTHONPATH=src python bench/fets_round_share.py [--repeats 5] [--steps 3] [--forwards 2]

A round of the simulation (`dpmed.fets.run.play_round`) is the chosen collaborators' local
training, one after another, then the aggregation, then every collaborator's validation of the
new model. A whole paper round takes hours on a small CPU, so this bench does not run one: the
round's wall time is an ESTIMATE, the median time of `--steps` real training steps of the
paper's model at its patch and batch size (forward, cross-entropy + soft Dice, backward, Adam,
as `dpmed.fets.collaborator.Collaborator.train`) times the round's training steps, plus the
median time of `--forwards` validation forwards (a batch of tiles, as
`dpmed.fets.patches.predict_volume`) times the round's validation forwards, plus the measured
aggregation. The counts come from the real FeTS 2022 partitioning (1251 subjects over 33
partitions, `dpmed.data.synthetic.fets.partition_sizes(1.0)`), max(1, round(val_fraction·n))
validation subjects per partition as preprocessing holds out: training steps = local_epochs ×
n_train × patches_per_subject / batch_size summed over the chosen collaborators (their mean
n_train times the count); validation = every validation subject of the 33, each a volume of the
configured synthetic shape zero-padded to whole patches (the crop to the brain gives real
volumes fewer tiles, so "training only" is printed too: the share's upper bound).

The aggregation runs through `Server.aggregate`, the simulation's code path, in a process that
keeps freed memory as the jobs do (`dpmed.allocator`), its timers round-robin so that the
machine's drift reaches all of them alike; the medians are printed. Timings vary between runs
on a shared machine: only the ratios mean much.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from fets_aggregation import interleaved

from dpmed.allocator import keep_freed_memory
from dpmed.data.synthetic.fets import partition_sizes
from dpmed.fets.collaborator import TILE_BATCHES, soft_dice_loss, state_to_numpy
from dpmed.fets.run import MODEL
from dpmed.fets.server import Server, ServerConfig
from dpmed.models import build_model

CONFIG = Path(__file__).resolve().parents[1] / "config" / "config.yaml"
SETTINGS = [("dp_simagg", "sound"), ("dp_simagg", "paper"), ("dp_fedavg", "sound"),
            ("fedavg", "none")]  # fmt: skip
COLLABORATORS = (6, 33)
CLASSES = 4


def fets_settings() -> tuple[dict, dict]:
    """(fets.defaults, data.fets) of the project's config."""
    config = yaml.safe_load(CONFIG.read_text())
    return config["fets"]["defaults"], config["data"]["fets"]


def paper_model(hp: dict) -> torch.nn.Module:
    """The fets model of `hp` (fets.defaults)."""
    return build_model(MODEL, in_channels=4, n_classes=CLASSES, base_filters=hp["base_filters"],
                       depth=hp["depth"], norm=hp["norm"])  # fmt: skip


def round_counts(hp: dict, data: dict, chosen: int) -> tuple[float, int]:
    """(training steps, validation forwards) of one round with `chosen` collaborators."""
    sizes = partition_sizes(1.0)
    val = [max(1, round(data["val_fraction"] * n)) for n in sizes]
    mean_train = float(np.mean([n - v for n, v in zip(sizes, val, strict=True)]))
    steps = chosen * hp["local_epochs"] * mean_train * hp["patches_per_subject"] / hp["batch_size"]
    shape, patch = data["synthetic"]["shape"], hp["patch_size"]
    tiles = int(np.prod([-(-s // p) for s, p in zip(shape, patch, strict=True)]))
    forwards = sum(val) * -(-tiles // (TILE_BATCHES * hp["batch_size"]))
    return steps, forwards


def step_seconds(hp: dict, steps: int, forwards: int) -> tuple[float, float]:
    """Median seconds of one training step and of one validation forward of the paper's model
    at its patch and batch size (after one warm-up each)."""
    torch.manual_seed(0)
    model = paper_model(hp)
    optimizer = torch.optim.Adam(model.parameters(), lr=hp["lr"])
    batch = hp["batch_size"]
    x = torch.randn(batch, 4, *hp["patch_size"])
    y = torch.randint(0, CLASSES, (batch, *hp["patch_size"]))

    def train_step() -> None:
        logits = model(x)
        loss = F.cross_entropy(logits, y, reduction="none").mean() + soft_dice_loss(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    tiles = torch.randn(TILE_BATCHES * batch, 4, *hp["patch_size"])

    def forward() -> None:
        with torch.no_grad():
            model(tiles).argmax(dim=1)

    model.train()
    train = _median(train_step, steps)
    model.eval()
    return train, _median(forward, forwards)


def _median(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def aggregation_seconds(hp: dict, n: int, repeats: int) -> dict[str, float]:
    """Median seconds of `Server.aggregate` per (aggregator, mode) of `SETTINGS` for a round of
    `n` collaborators of the paper's model (updates ~1e-3, private modes at eps0 = 1)."""
    keep_freed_memory()  # as the simulation's process does (dpmed.runtime.JobContext.start)
    torch.manual_seed(0)
    glob = state_to_numpy(paper_model(hp))
    rng = np.random.default_rng(0)
    local = [
        (str(i), {k: v + 1e-3 * rng.standard_normal(v.shape, dtype=np.float32)
                  for k, v in glob.items()}, float(10 + i))
        for i in range(n)
    ]  # fmt: skip
    timers: dict[str, Callable[[], object]] = {}
    for aggregator, mode in SETTINGS:
        eps = None if mode == "none" else 1.0
        cfg = ServerConfig(aggregator, mode, eps, hp["delta"], float(hp["clip_norm"]), "l2",
                           "analytic", 0)  # fmt: skip
        server = Server(cfg)
        timers[f"{aggregator}/{mode}"] = lambda s=server: s.aggregate(glob, local, 1)
    for fn in timers.values():  # warm-up: buffers touched
        fn()
    return interleaved(timers, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--forwards", type=int, default=2)
    args = parser.parse_args()
    hp, data = fets_settings()
    train, forward = step_seconds(hp, args.steps, args.forwards)
    print(f"training step {train:.2f} s, validation forward ({TILE_BATCHES} tiles) {forward:.2f} s")
    print(f"{'aggregator':<20}{'n':>4}{'agg s':>9}{'round s':>10}{'share %':>9}"
          f"{'training-only share %':>23}")  # fmt: skip
    for n in COLLABORATORS:
        steps, forwards = round_counts(hp, data, n)
        training, validation = steps * train, forwards * forward
        for label, agg in aggregation_seconds(hp, n, args.repeats).items():
            total = training + validation + agg
            print(f"{label:<20}{n:>4}{agg:>9.3f}{total:>10.0f}{100 * agg / total:>9.3f}"
                  f"{100 * agg / (training + agg):>23.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
