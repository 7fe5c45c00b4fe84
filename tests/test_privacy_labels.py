"""Every privacy.json says what its guarantee covers and which files beside it it does not
cover (tiny seg and fets runs); the seg diagnostics that leak live in diagnostics/; fets paper
mode gives only privacy reasons; deployable noise (the OpenFL adapter, a server without a seed)
is unpredictable unless a seed is passed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_fets_adapter import _local_tensors, _round
from test_fets_simulation import PARAMS as FETS_PARAMS
from test_fets_simulation import processed  # noqa: F401 (a fixture)
from test_seg_train import PARAMS, train, wildcards

from dpmed.fets import privacy as fets_privacy
from dpmed.fets.openfl_adapter import fets_dp_simagg
from dpmed.fets.run import run as fets_run
from dpmed.fets.server import Server, ServerConfig
from dpmed.privacy.mechanisms import NOISE_OS_ENTROPY, NOISE_SEEDED
from dpmed.runtime import JobContext
from dpmed.seg.outputs import ATTACK_FILE

# A file named in a not_covered entry (the part before its first ": ").
FILE = re.compile(r"[\w./-]+\.(?:csv|json|pt|npz)\b")
SEG_LEAKS = ("alignment.csv", "morph_log.csv", "history.csv")
SEG_RUNS = {
    "private": wildcards(clip="flat", morph="adaptive-v2-s", eps="50"),
    "non-private": wildcards(),
}
FETS_RUNS = {
    "paper": {"aggregator": "dp_simagg", "dpmode": "paper", "eps": "10", "seed": "0"},
    "sound": {"aggregator": "dp_simagg", "dpmode": "sound", "eps": "1", "seed": "0"},
}


@pytest.fixture(scope="module")
def seg_runs(duke, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    params = PARAMS | {"epochs": 1, "depth": 2, "width": 4}
    folders = {}
    for kind, wc in SEG_RUNS.items():
        folders[kind] = tmp_path_factory.mktemp(f"seg_{kind}")
        train(duke, folders[kind], wc, params, 0)
    return folders


@pytest.fixture(scope="module")
def fets_runs(processed, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    folders = {}
    for mode, wc in FETS_RUNS.items():
        folders[mode] = tmp_path_factory.mktemp(f"fets_{mode}")
        job = JobContext(processed, folders[mode], wc, FETS_PARAMS | {"rounds": 1}, 11, "cpu", 1)
        fets_run(job)
    return folders


def _labels(folder: Path, private: bool) -> tuple[dict, list[str]]:
    """privacy.json of `folder` and the files its not_covered entries name, after checking
    that covers is set exactly when private and that every named file is in the folder
    (attack.json aside: the seg_attack rule writes it later)."""
    record = json.loads((folder / "privacy.json").read_text())
    assert isinstance(record["covers"], str) and bool(record["covers"]) == private
    assert record["not_covered"] and all(isinstance(e, str) for e in record["not_covered"])
    named = [f for e in record["not_covered"] for f in FILE.findall(e.partition(": ")[0])]
    for name in named:
        assert name == ATTACK_FILE or (folder / name).is_file(), name
    return record, named


@pytest.mark.parametrize("kind", list(SEG_RUNS))
def test_seg_record_says_what_it_covers(seg_runs, kind):
    record, named = _labels(seg_runs[kind], kind == "private")
    if kind == "private":
        assert {f"diagnostics/{name}" for name in SEG_LEAKS} <= set(named)
        assert "model.pt" in record["covers"]
        assert record["extra"]["noise_source"] == NOISE_SEEDED


def test_seg_diagnostics_leave_the_top_level(seg_runs):
    for folder in seg_runs.values():
        assert not {p.name for p in folder.iterdir()} & set(SEG_LEAKS)
        for name in SEG_LEAKS:
            assert (folder / "diagnostics" / name).is_file(), name
        for table in folder.glob("*.csv"):
            assert "loss" not in pd.read_csv(table).columns, table
    morph_log = pd.read_csv(seg_runs["private"] / "diagnostics" / "morph_log.csv")
    assert len(morph_log) > 0
    history = pd.read_csv(seg_runs["private"] / "diagnostics" / "history.csv")
    assert {"loss", "val_dice", "epsilon"} <= set(history.columns)


@pytest.mark.parametrize("mode", list(FETS_RUNS))
def test_fets_record_says_what_it_covers(fets_runs, mode):
    record, named = _labels(fets_runs[mode], private=True)
    assert {"rounds.csv", "selection.csv", "resources.json"} <= set(named)
    assert "global model after every round" in record["covers"]
    assert record["extra"]["noise_source"] == NOISE_SEEDED


def test_fets_paper_reasons_are_privacy_reasons_only(fets_runs):
    record = json.loads((fets_runs["paper"] / "privacy.json").read_text())
    assert record["guarantee"] == "paper-approximation" and record["reasons"]
    assert not any(re.search(r"updates|model weights", r) for r in record["reasons"])
    assert any("proven only for eps <= 1" in r for r in record["reasons"])  # eps0 = 10
    notes = record["extra"]["utility_notes"]
    assert any("updates" in n and "C-ball" in n for n in notes)


@pytest.mark.parametrize("mode", ["paper", "sound"])
def test_adapter_noise_is_unpredictable_unless_seeded(mode):
    names, _, local, weights, db = _round()

    def aggregate(**seed: int) -> np.ndarray:
        fn = fets_dp_simagg(1.0, 1e-5, clip_norm=0.5, mode=mode, **seed)
        name = names[0]
        return fn(_local_tensors(name, local, weights), db, name, 3, {3: list(weights)}, None)

    assert not np.array_equal(aggregate(), aggregate())
    assert np.array_equal(aggregate(seed=7), aggregate(seed=7))


def test_a_server_without_a_seed_draws_os_entropy_and_says_so():
    _, glob, local, weights, _ = _round()
    cfg = ServerConfig("dp_simagg", "sound", 1.0, 1e-5, 0.5, "l2", "analytic", None)
    triples = [(c, local[c], w) for c, w in weights.items()]
    a, mech = Server(cfg).aggregate(glob, triples, 1)
    b, _ = Server(cfg).aggregate(glob, triples, 1)
    assert not all(np.array_equal(a[n], b[n]) for n in a)
    record = fets_privacy.privacy_record(cfg, 1, fets_privacy.round_columns(cfg, 1, mech))
    assert record.extra["noise_source"] == NOISE_OS_ENTROPY
