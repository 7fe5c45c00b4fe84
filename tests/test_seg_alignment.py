"""Gradient alignment (paper 002 §5.2, Fig. 7): the optimizer's per-step cosine against exact
cases and a brute-force per-sample loop, alignment.csv from training, and the figure."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import noise_free_dp_step
from PIL import Image
from test_seg_train import PARAMS, train, wildcards
from torch.utils.data import TensorDataset

from dpmed.models import build_model
from dpmed.privacy.clipping import ClipRule, private_rules
from dpmed.privacy.dpsgd import ScaledPrivacyEngine
from dpmed.seg.diagnostics import ALIGNMENT_COLUMNS
from dpmed.seg.losses import per_sample_loss
from dpmed.seg.report.alignment import alignment_figure


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny_net(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(1)
    return build_model("unet", in_channels=1, n_classes=3, width=2, depth=1).to(dtype)


def _batch(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    scale = torch.tensor([0.01, 0.3, 1.0, 5.0, 30.0])[:, None, None, None]
    x = torch.randn(5, 1, 8, 8, generator=g) * scale
    return x.to(dtype), torch.randint(0, 3, (5, 8, 8), generator=g)


def _per_sample_gradients(net, x, y) -> np.ndarray:
    """[B, P] materialised per-sample gradients, one autograd pass per sample (float64)."""
    rows = []
    for i in range(len(x)):
        net.zero_grad()
        per_sample_loss(net(x[i : i + 1]), y[i : i + 1]).sum().backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]).double().numpy())
    net.zero_grad()
    return np.stack(rows)


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_flat_without_clipping_is_exactly_aligned(mode):
    net = _tiny_net(torch.float32)
    x, y = _batch(torch.float32)
    opt = noise_free_dp_step(net, x, y, ClipRule("flat", clip_norm=1e6), mode)
    stat = opt.last_alignment
    assert stat.cosine == 1.0
    assert stat.batch_size == 5 and stat.clipped_fraction == 0.0


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ghost"])
@pytest.mark.parametrize("name", private_rules())
def test_cosine_equals_brute_force_on_materialised_gradients(name, mode):
    net = _tiny_net(torch.float64)
    x, y = _batch(torch.float64)
    grads = _per_sample_gradients(net, x, y)
    norms = np.linalg.norm(grads, axis=1)
    ranked = np.sort(norms)
    clip = float(ranked[1] + ranked[2]) / 2  # flat clips 3 of the 5 samples
    rule = ClipRule(name, clip_norm=clip)
    factors = rule.factors(torch.from_numpy(norms)).numpy()
    a = factors @ grads
    b = grads.mean(axis=0)
    expected = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    stat = noise_free_dp_step(net, x, y, rule, mode).last_alignment
    assert stat.cosine == pytest.approx(expected, abs=1e-10)
    assert stat.cosine < 1 - 1e-6  # the rules really turn the gradient
    assert stat.batch_size == 5
    assert stat.clipped_fraction == pytest.approx(float(np.mean(factors < 1)))
    if name == "flat":
        assert stat.clipped_fraction == pytest.approx(0.6)


def test_empty_batch_has_no_alignment():
    net = _tiny_net(torch.float32)
    x, y = _batch(torch.float32)
    dp = ScaledPrivacyEngine(ClipRule("psac")).make_private_poisson(
        net,
        torch.optim.SGD(net.parameters(), lr=0.0),
        TensorDataset(x, y),
        sample_rate=0.5,
        noise_multiplier=1.0,
        grad_sample_mode="hooks",
    )
    dp.optimizer.zero_grad()
    dp.backward(per_sample_loss(dp.module(x), y))
    dp.optimizer.step()
    assert dp.optimizer.last_alignment is not None
    dp.optimizer.zero_grad()
    dp.step_empty()
    assert dp.optimizer.last_alignment is None


def test_train_writes_one_row_per_non_empty_step(duke, tmp_path):  # noqa: F811
    # expected batch size 1: some Poisson batches are empty (noise-only steps, no row)
    params = PARAMS | {"epochs": 2, "depth": 2, "width": 4, "batch_size": 1}
    metrics = train(duke, tmp_path, wildcards(clip="nsgd", eps="20"), params, 3)
    steps = pd.read_csv(tmp_path / "diagnostics/alignment.csv")
    assert list(steps.columns) == ALIGNMENT_COLUMNS
    per_epoch = metrics["n_train"]
    empty = json.loads((tmp_path / "privacy.json").read_text())["extra"]["empty_batches"]
    assert empty > 0 and len(steps) == 2 * per_epoch - empty
    assert steps["step"].is_unique and steps["step"].between(1, 2 * per_epoch).all()
    assert sorted(set(steps["epoch"])) == [1, 2]
    assert (steps["batch_size"] > 0).all()
    assert steps["clipped_fraction"].between(0, 1).all()
    assert steps["cosine"].between(-1, 1 + 1e-9).all()


def test_non_private_run_writes_the_header_only(duke, tmp_path):  # noqa: F811
    params = PARAMS | {"epochs": 1, "depth": 2, "width": 4}
    train(duke, tmp_path, wildcards(), params, 0)
    text = (tmp_path / "diagnostics/alignment.csv").read_text()
    assert text == ",".join(ALIGNMENT_COLUMNS) + "\n"


def _write_run(root, clip: str, cosines: list[float], model: str = "unetpp", dataset="duke"):
    run = (
        root / "results/seg" / dataset / model / clip / "none" / "eps200" / "seed0" / "diagnostics"
    )
    run.mkdir(parents=True)
    n = len(cosines)
    frame = pd.DataFrame(
        {"epoch": 1, "step": range(1, n + 1), "batch_size": 8, "clipped_fraction": 0.5}
    ).assign(cosine=cosines)
    frame.to_csv(run / "alignment.csv", index=False)
    return run / "alignment.csv"


def test_figure_from_hand_made_runs(tmp_path, capsys):
    paths = [
        _write_run(tmp_path, "flat", [0.9, 0.95, 0.99]),
        _write_run(tmp_path, "psac", [0.2, 0.5, math.nan, 0.8]),
        _write_run(tmp_path, "nsgd", [0.97], model="unet", dataset="umn"),
        _write_run(tmp_path, "flat-C0.5-lr0.001", [-1.0, -1.0]),  # sweep cell: skipped
    ]
    png = tmp_path / "fig7.png"
    summary = alignment_figure(paths, png)
    assert png.exists() and png.with_suffix(".pdf").exists()
    assert Image.open(png).size[0] > 400
    got = {(r.dataset, r.model, r.clip): (r.steps, r.median) for r in summary.itertuples()}
    assert got == {
        ("duke", "unetpp", "flat"): (3, 0.95),
        ("duke", "unetpp", "psac"): (3, 0.5),
        ("umn", "unet", "nsgd"): (1, 0.97),
    }
    out = capsys.readouterr().out
    assert "duke/unetpp" in out and "PSAC 0.5000" in out
    first = png.read_bytes()
    alignment_figure(paths, png)
    assert png.read_bytes() == first


def test_figure_rejects_nothing_usable(tmp_path):
    with pytest.raises(ValueError, match="no alignment"):
        alignment_figure([], tmp_path / "fig7.png")
    header_only = (
        tmp_path / "results/seg/duke/unet/none/none/epsinf/seed0/diagnostics/alignment.csv"
    )
    header_only.parent.mkdir(parents=True)
    header_only.write_text(",".join(ALIGNMENT_COLUMNS) + "\n")
    with pytest.raises(ValueError, match="no alignment"):
        alignment_figure([header_only], tmp_path / "fig7.png")
