"""Determinism settings of every job (cuBLAS workspace, strict deterministic kernels, cuDNN)
and the CUDA-deterministic stand-ins of the models (docs/reproducibility.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpmed.models import build_model
from dpmed.models.deterministic import (
    GlobalAvgPool2d,
    bilinear_resize,
    interpolation_matrix,
    separable_bilinear,
)
from dpmed.runtime import CUBLAS_WORKSPACE, seed_everything


def test_seeding_sets_the_cublas_workspace_and_strict_deterministic_kernels(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    seed_everything(0)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.benchmark is False
    assert torch.backends.cudnn.deterministic is True


def test_a_workspace_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    seed_everything(0)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_a_nondeterministic_op_raises_on_a_cuda_machine_too(monkeypatch):
    # put_ without accumulate has no deterministic kernel on any device; a job on a machine with
    # CUDA must fail on it, not warn and drift
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    seed_everything(0)
    with pytest.raises(RuntimeError, match="deterministic"):
        torch.zeros(3).put_(torch.tensor([0]), torch.tensor([1.0]))


def test_seeding_does_not_import_the_compiler_but_sets_its_flag_once_it_is_loaded():
    """torch.use_deterministic_algorithms imports torch._inductor (1.7 s of every job's start);
    seeding sets the same flags without it, and inductor's flag too when inductor is loaded."""
    code = (
        "import sys, torch\n"
        "from dpmed.runtime import seed_everything\n"
        "seed_everything(0)\n"
        "assert torch.are_deterministic_algorithms_enabled()\n"
        "assert 'torch._inductor' not in sys.modules, 'seeding imported torch._inductor'\n"
        "import torch._inductor.config as inductor\n"
        "inductor.deterministic = False\n"
        "seed_everything(0)\n"
        "assert inductor.deterministic is True\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("size_in", "size_out"),
    [((4, 4), (8, 8)), ((4, 4), (32, 32)), ((5, 7), (13, 3)), ((16, 16), (8, 8)), ((3, 3), (3, 3))],
)
def test_separable_bilinear_is_torchs_bilinear_interpolation(size_in, size_out):
    torch.manual_seed(0)
    x = torch.randn(2, 3, *size_in, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 3, *size_out, dtype=torch.float64)
    ours = separable_bilinear(x, size_out)
    ref = F.interpolate(x, size=size_out, mode="bilinear", align_corners=False)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    (g_ours,) = torch.autograd.grad((ours * weights).sum(), x)
    (g_ref,) = torch.autograd.grad((ref * weights).sum(), x)
    torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(bilinear_resize(x, size_out), ref, rtol=0, atol=0)  # CPU: native


def test_interpolation_rows_are_convex_weights_by_hand():
    # 2 → 4 (align_corners=False): sources -0.25→0, 0.25, 0.75, 1.25→ index 1 (clamped)
    expected = torch.tensor([[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]])
    torch.testing.assert_close(interpolation_matrix(2, 4), expected)


@pytest.mark.parametrize("model", ["resnet18", "efficientnet_b0"])
def test_classifiers_have_no_adaptive_pool_and_pool_the_same(model):
    net = build_model(model, in_channels=3, n_classes=4, image_size=28, width_scale=0.125)
    pools = [m for m in net.modules() if isinstance(m, GlobalAvgPool2d)]
    assert pools and not any(isinstance(m, nn.AdaptiveAvgPool2d) for m in net.modules())
    x = torch.randn(2, 8, 5, 5)
    torch.testing.assert_close(GlobalAvgPool2d()(x), nn.AdaptiveAvgPool2d(1)(x))
