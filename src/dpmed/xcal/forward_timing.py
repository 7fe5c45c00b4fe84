"""Paper 001 §8's overhead measure: two inference-mode forward passes per mini-batch.

The paper counts XCal-FL's extra cost per DP-SGD step as two inference-mode forward passes (the
clean and the masked image). Our XCal-FL step costs more than that: a Grad-CAM forward and
backward pass plus the masked forward, on a Poisson sample of its own. The runs time the
paper's measure after training, on the final global model, so the runtime table can give both.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from dpmed.explain.gradcam import quiet

if TYPE_CHECKING:
    from dpmed.xcal.client import Client

REPEATS = 3  # timed repetitions after one warm-up pass; their median counts


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pair_seconds(module: nn.Module, x: torch.Tensor) -> float:
    """Median wall-clock seconds of two forward passes of `module` on `x` in eval mode under
    `torch.inference_mode` (Opacus hooks off), after one warm-up pass."""
    samples = []
    with quiet(module) as net, torch.inference_mode():
        net(x)
        for _ in range(REPEATS):
            _synchronize(x.device)
            start = time.perf_counter()
            net(x)
            net(x)
            _synchronize(x.device)
            samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def forward_pair_seconds(module: nn.Module, clients: Sequence[Client]) -> float | None:
    """`pair_seconds` on the first ⌈q·n⌉ images (the expected Poisson batch) of the first
    client that trained (the clients' expected batches all have about the configured size, so
    one suffices); None when no client trained."""
    trained = [c for c in clients if c.account.rounds]
    if not trained:
        return None
    client, account = trained[0], trained[0].account
    return pair_seconds(module, client.x[: max(1, int(np.ceil(account.q * account.n)))])
