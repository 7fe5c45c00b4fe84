"""A deployed xcal client's secret generators cannot be searched.

torch's CPU MT19937 keeps only the low 32 bits of a seed, so a client seeded with a secret
63-bit number has one of 2^32 states: a server could try them all against a released update.
Every state `manual_seed` can reach satisfies MT19937's seeding recurrence
w[i] = 1812433253·(w[i−1] ⊕ (w[i−1] >> 30)) + i (mod 2^32), checked here on the state words;
a secret generator's state (`secret_torch_generator`) is drawn whole from the OS CSPRNG.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpmed.privacy.mechanisms import MT_WORDS, MT_WORDS_AT, secret_torch_generator
from dpmed.xcal.client import Client
from dpmed.xcal.methods import METHODS

pytest.importorskip("flwr")
from dpmed.xcal.flower import client_app  # noqa: E402


def mt_words(generator: torch.Generator) -> np.ndarray:
    state = generator.get_state().numpy()
    return state[MT_WORDS_AT : MT_WORDS_AT + 8 * MT_WORDS].view("<u8").copy()


def reachable_by_manual_seed(words: np.ndarray) -> bool:
    """Whether the 624 words follow MT19937's seeding recurrence (a 32-bit seed's state)."""
    w = words.astype(np.uint64)
    expected = (
        np.uint64(1812433253) * (w[:-1] ^ (w[:-1] >> 30)) + np.arange(1, MT_WORDS, dtype=np.uint64)
    ) % np.uint64(2**32)
    return bool(np.array_equal(expected.astype(np.uint64), w[1:]))


def test_the_recurrence_recognises_a_seeded_state_whatever_the_seed_width():
    seeded = torch.Generator().manual_seed(2**62 + 12345)
    assert reachable_by_manual_seed(mt_words(seeded))
    low = torch.Generator().manual_seed(12345)  # torch keeps the low 32 bits only
    assert torch.equal(torch.rand(8, generator=seeded), torch.rand(8, generator=low))


def test_a_secret_generator_is_no_seeded_state_and_draws_uniforms():
    first, second = secret_torch_generator(), secret_torch_generator()
    assert not reachable_by_manual_seed(mt_words(first))
    a, b = torch.rand(20_000, generator=first), torch.rand(20_000, generator=second)
    assert not torch.equal(a, b)
    assert abs(a.mean().item() - 0.5) < 0.01 and 0.0 <= a.min() and a.max() < 1.0
    normals = torch.randn(20_000, generator=first)
    assert abs(normals.mean().item()) < 0.03 and abs(normals.std().item() - 1) < 0.03


def test_a_secret_seeded_client_has_no_searchable_generator():
    params = {"batch_size": 4, "rounds": 1, "local_epochs": 1, "delta": 1e-5}
    x, y = torch.zeros(8, 1, 4, 4), torch.zeros(8, dtype=torch.long)
    client = Client(0, x, y, METHODS["nondp"], params, float("inf"), client_app.SECRET_SEEDS, "")
    for name in ("sampler", "signal_sampler", "noise"):
        assert not reachable_by_manual_seed(mt_words(getattr(client, name))), name
