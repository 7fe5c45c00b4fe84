"""Common random numbers in seg: runs of one (dataset, model, seed) block that differ only in
the compared factor (clip rule, morphology, ε) start from the same weights and see the same
Poisson batches, while their DP noise streams stay independent (the job seed). Checked through
the runner itself on the first step of each run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import SEG_PARAMS

from dpmed.config.grid import job_seed
from dpmed.runtime import JobContext
from dpmed.seg import run as seg_run

PARAMS = SEG_PARAMS | {"epochs": 1, "width": 4, "depth": 2}


def first_step(processed: str, out: Path, patch: pytest.MonkeyPatch, **wc: str) -> dict:
    """Run one epoch of the seg job with wildcards `wc` (its rule's job seed) and return its
    initial weights, the images of its first sampled batch and the global (noise) RNG state
    when that batch is drawn."""
    wildcards = dict(dataset="duke", model="unet", clip="none", morph="none", eps="inf", seed="0")
    wildcards |= wc
    seen: dict = {}
    make_optimizer, batch_loss = seg_run.make_optimizer, seg_run._batch_loss

    def record_weights(net, params):
        seen["weights"] = {k: v.detach().clone() for k, v in net.state_dict().items()}
        return make_optimizer(net, params)

    def record_batch(module, morph, state, x, y, dice_weight):
        if "batch" not in seen:
            seen["batch"] = x.detach().clone()
            seen["noise_rng"] = torch.random.get_rng_state()
        return batch_loss(module, morph, state, x, y, dice_weight)

    patch.setattr(seg_run, "make_optimizer", record_weights)
    patch.setattr(seg_run, "_batch_loss", record_batch)
    seed = job_seed("seg", wildcards)
    seg_run.run(JobContext(Path(processed), out, wildcards, dict(PARAMS), seed, "cpu", 1))
    patch.undo()
    return seen


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "other",
    [{"clip": "nsgd"}, {"eps": "50"}, {"morph": "close-k3"}],
    ids=["clip rule", "eps", "morphology"],
)
def test_runs_differing_in_one_factor_share_weights_and_batches(duke, tmp_path, monkeypatch, other):
    base = first_step(duke, tmp_path / "a", monkeypatch, clip="flat", eps="20")
    wc = {"clip": "flat", "eps": "20"}
    compared = first_step(duke, tmp_path / "b", monkeypatch, **(wc | other))
    assert same_weights(base["weights"], compared["weights"])
    assert torch.equal(base["batch"], compared["batch"])
    # the DP noise (the global RNG, seeded by the job seed) is drawn independently
    assert not torch.equal(base["noise_rng"], compared["noise_rng"])


def test_another_seed_is_another_block(duke, tmp_path, monkeypatch):
    base = first_step(duke, tmp_path / "a", monkeypatch, clip="flat", eps="20")
    other = first_step(duke, tmp_path / "b", monkeypatch, clip="flat", eps="20", seed="1")
    assert not same_weights(base["weights"], other["weights"])
    assert not torch.equal(base["batch"], other["batch"])


def test_non_private_run_starts_from_the_blocks_weights(duke, tmp_path, monkeypatch):
    private = first_step(duke, tmp_path / "a", monkeypatch, clip="flat", eps="20")
    reference = first_step(duke, tmp_path / "b", monkeypatch)
    assert same_weights(private["weights"], reference["weights"])
