"""Paper 001 §8's overhead measure as timed: two inference-mode forward passes per repetition,
in eval mode without autograd, the module's mode restored afterwards."""

from __future__ import annotations

import torch
from torch import nn

from dpmed.xcal import run as timing


def test_pair_seconds_times_two_inference_mode_forward_passes():
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    net.train()
    calls: list[tuple[bool, bool]] = []

    def record(module, inputs, output):
        calls.append((module.training, torch.is_inference_mode_enabled()))

    net.register_forward_hook(record)
    seconds = timing.pair_seconds(net, torch.rand(5, 3, 2, 2))
    assert seconds > 0
    assert len(calls) == 1 + 2 * timing.REPEATS  # one warm-up, then pairs
    assert all(not training and inference for training, inference in calls)
    assert net.training
