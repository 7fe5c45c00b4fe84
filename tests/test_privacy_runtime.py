"""Shared privacy accounting, the privacy record, and the training-job runtime helpers."""

from __future__ import annotations

import io
import json
import math

import pytest
import torch
from opacus.accountants.analysis import rdp as opacus_rdp

from dpmed.privacy.accounting import epsilon, noise_multiplier
from dpmed.privacy.record import PrivacyRecord
from dpmed.runtime import Progress, select_device


def test_epsilon_of_a_heterogeneous_history_adds_rdp_per_order():
    history = [(1.1, 0.01, 300), (0.9, 0.01, 200)]
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    rdp = sum(
        opacus_rdp.compute_rdp(q=q, noise_multiplier=s, steps=n, orders=orders)
        for s, q, n in history
    )
    expected, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
    assert epsilon(history, 1e-5, "rdp") == pytest.approx(expected, rel=1e-9)
    assert epsilon([], 1e-5) == 0.0


def test_noise_multiplier_meets_the_target():
    sigma = noise_multiplier(2.0, 1e-5, sample_rate=0.02, steps=500)
    assert epsilon([(sigma, 0.02, 500)], 1e-5) <= 2.0
    assert epsilon([(sigma * 0.95, 0.02, 500)], 1e-5) > 1.9


def test_prv_is_at_most_rdp():
    history = [(1.0, 0.01, 1000)]
    assert epsilon(history, 1e-5, "prv") <= epsilon(history, 1e-5, "rdp")


def test_privacy_record_rules(tmp_path):
    record = PrivacyRecord(
        mechanism="DP-SGD",
        adjacency="sample-level",
        sampling="poisson",
        accountant="rdp",
        epsilon=3.0,
        delta=1e-5,
        guarantee="dp",
        noise_multipliers=[1.2],
        covers="the released model weights",
    )
    record.write(tmp_path / "privacy.json", "duke")
    written = json.loads((tmp_path / "privacy.json").read_text())
    assert written["epsilon"] == 3.0
    assert written["privacy_unit"].startswith("one annotated B-scan")
    with pytest.raises(ValueError, match="reasons"):
        PrivacyRecord("m", "a", "s", "basic", 20.0, 1e-5, "paper-approximation")
    with pytest.raises(ValueError, match="covers"):
        PrivacyRecord("m", "a", "s", "rdp", 3.0, 1e-5, "dp")
    with pytest.raises(ValueError, match="non-private"):
        PrivacyRecord("m", "a", "s", "rdp", math.inf, None, "none")


def test_progress_line():
    stream = io.StringIO()
    progress = Progress("seg", total=4, start=1, stream=stream)
    text = progress.line(2, {"loss": 0.5, "dice": 0.71234}, epsilon=1.5)
    assert text.startswith("[seg] 2/4 loss=0.5 dice=0.7123 eps=1.5 elapsed=")
    assert "eta=" in text and stream.getvalue().strip() == text
    assert "eps=inf" in progress.line(3, {}, epsilon=None)


def test_select_device():
    assert select_device("cpu").type == "cpu"
    assert select_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_non_private_record():
    record = PrivacyRecord.non_private("none (plain SGD)", "sample-level", "poisson", steps=7)
    assert (record.epsilon, record.delta, record.guarantee, record.accountant, record.steps) == (
        None, None, "none", "none", 7)  # fmt: skip
