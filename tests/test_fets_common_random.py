"""Common random numbers in fets: runs of one seed block that differ only in the aggregator
start from the same weights, follow the same collaborator schedule and draw the same first
local-training patches, while their server noise stays independent (the job seed). Checked
through the runner itself on one round of each run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_fets_simulation import PARAMS, _processed

from dpmed.config.grid import job_seed
from dpmed.fets import collaborator as fets_collaborator
from dpmed.fets import run as fets_run
from dpmed.fets import server as fets_server
from dpmed.runtime import JobContext


@pytest.fixture(scope="module")
def processed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _processed(tmp_path_factory.mktemp("fets_common"))


def first_round(processed: Path, out: Path, patch: pytest.MonkeyPatch, **wc: str) -> dict:
    """Run round 1 of the fets job with wildcards `wc` (its rule's job seed) and return its
    initial weights, its selection log, the first batch of patches drawn in local training
    and the first values of its round-1 noise stream."""
    wildcards = {"aggregator": "dp_fedavg", "dpmode": "sound", "eps": "10", "seed": "0"} | wc
    seen: dict = {"patches": []}
    build, sample = fets_run.build_federation, fets_collaborator.sample_patch
    noise = fets_server.noise_generator

    def record_weights(job, device):
        federation = build(job, device)
        seen["weights"] = {k: v.detach().clone() for k, v in federation.model.state_dict().items()}
        return federation

    def record_patch(*args):
        image, label = sample(*args)
        seen["patches"].append(image.copy())
        return image, label

    def record_noise(seed, *stream):
        seen.setdefault("noise", noise(seed, *stream).standard_normal(8))
        return noise(seed, *stream)

    patch.setattr(fets_run, "build_federation", record_weights)
    patch.setattr(fets_collaborator, "sample_patch", record_patch)
    patch.setattr(fets_server, "noise_generator", record_noise)
    params = PARAMS | {"rounds": 1}
    job = JobContext(processed, out, wildcards, params, job_seed("fets", wildcards), "cpu", 1)
    fets_run.run(job)
    patch.undo()
    seen["selection"] = pd.read_csv(out / "selection.csv")[["round", "collaborator"]]
    seen["batch"] = np.stack(seen["patches"][: int(params["batch_size"])])
    return seen


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_aggregators_share_weights_schedule_and_patches(processed, tmp_path, monkeypatch):
    fedavg = first_round(processed, tmp_path / "a", monkeypatch)
    simagg = first_round(processed, tmp_path / "b", monkeypatch, aggregator="dp_simagg")
    assert same_weights(fedavg["weights"], simagg["weights"])
    assert fedavg["selection"].equals(simagg["selection"])
    assert np.array_equal(fedavg["batch"], simagg["batch"])
    # the server's DP noise (the job seed: all wildcards) is drawn independently
    assert not np.array_equal(fedavg["noise"], simagg["noise"])


def test_another_seed_is_another_block(processed, tmp_path, monkeypatch):
    base = first_round(processed, tmp_path / "a", monkeypatch)
    other = first_round(processed, tmp_path / "b", monkeypatch, seed="1")
    assert not same_weights(base["weights"], other["weights"])
    assert not np.array_equal(base["batch"], other["batch"])
