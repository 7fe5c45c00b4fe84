"""Calibration of the Gaussian mechanism: noise std σ for an L2 sensitivity Δ and (ε, δ).

Three calibrations (docs/privacy.md, finding 3):

- `classic_sigma`: σ = Δ·√(2 ln(1.25/δ))/ε (Dwork & Roth, Thm A.1). Proven only for ε ≤ 1;
  DP-SimAgg's paper mode uses it at every ε0 (Algorithm 2), so it is reproduced as written.
- `analytic_sigma`: the analytic Gaussian mechanism (Balle & Wang 2018, Thm 8): the smallest σ
  with δ(ε; σ) ≤ δ, where δ(ε; σ) = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) is the exact privacy
  profile of N(0, σ²). Valid for every ε > 0.
- `rdp_sigma`: the σ whose RDP curve α/(2 (σ/Δ)²), converted to (ε, δ) by Opacus' RDP
  accountant (sample rate 1, one step), gives ε.

`rdp_epsilon` composes Gaussian mechanisms of given noise multipliers (σ/Δ) under RDP.

Noise source: a deployed mechanism draws its noise from `secure_generator` (fresh OS entropy);
a seeded generator is for reproducible simulations only, since anyone who knows the seed can
regenerate the noise and subtract it. privacy.json states which (`noise_source`).
"""

from __future__ import annotations

import math
import secrets
from typing import TYPE_CHECKING

from scipy.optimize import brentq
from scipy.special import log_ndtr

if TYPE_CHECKING:
    import torch

    from dpmed.privacy.normals import NormalSource


def _check(sensitivity: float, epsilon: float, delta: float) -> None:
    if sensitivity < 0 or not math.isfinite(sensitivity):
        raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity}")
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def classic_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = Δ·√(2 ln(1.25/δ))/ε (classic Gaussian mechanism; formally valid for ε ≤ 1 only)."""
    _check(sensitivity, epsilon, delta)
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism with σ/Δ = `noise_multiplier` (Balle & Wang 2018,
    Thm 8), computed in log space so tiny δ stay accurate."""
    if noise_multiplier <= 0:
        return 1.0
    a = 1.0 / (2.0 * noise_multiplier)
    b = epsilon * noise_multiplier
    first = log_ndtr(a - b)
    second = epsilon + log_ndtr(-a - b)
    if second >= first:
        return 0.0
    return float(math.exp(first) * -math.expm1(second - first))


def analytic_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ with δ(ε; σ) ≤ δ for sensitivity Δ (analytic Gaussian mechanism), by root
    finding on the exact privacy profile (relative tolerance 1e-12 in σ/Δ)."""
    _check(sensitivity, epsilon, delta)
    if sensitivity == 0:
        return 0.0
    low, high = 1e-6, 1.0
    while gaussian_delta(high, epsilon) > delta:
        high *= 2.0
    while gaussian_delta(low, epsilon) <= delta:
        low /= 2.0
    z = brentq(lambda s: gaussian_delta(s, epsilon) - delta, low, high, xtol=1e-14, rtol=1e-12)
    # brentq may land a hair below the root: step up until δ(ε) ≤ δ holds exactly.
    while gaussian_delta(z, epsilon) > delta:
        z *= 1.0 + 1e-12
    return sensitivity * z


def rdp_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = Δ·z with z the smallest noise multiplier (Opacus tolerance 0.01 in ε) that one
    unsampled Gaussian mechanism needs for (ε, δ) under RDP conversion."""
    from dpmed.privacy import accounting  # imports Opacus: only when RDP is asked for

    _check(sensitivity, epsilon, delta)
    return sensitivity * accounting.noise_multiplier(epsilon, delta, 1.0, 1, "rdp")


CALIBRATIONS = {"classic": classic_sigma, "analytic": analytic_sigma, "rdp": rdp_sigma}


def calibrate(name: str, sensitivity: float, epsilon: float, delta: float) -> float:
    """σ by the calibration `name` ∈ {classic, analytic, rdp}."""
    if name not in CALIBRATIONS:
        raise ValueError(f"unknown calibration '{name}' (known: {', '.join(CALIBRATIONS)})")
    return CALIBRATIONS[name](sensitivity, epsilon, delta)


def rdp_epsilon(noise_multiplier: float, mechanisms: int, delta: float) -> float:
    """ε at `delta` of `mechanisms` unsampled Gaussian mechanisms with σ/Δ = `noise_multiplier`,
    composed under RDP (Opacus RDP accountant, sample rate 1)."""
    from dpmed.privacy import accounting

    if mechanisms <= 0:
        return 0.0
    return accounting.epsilon([(noise_multiplier, 1.0, mechanisms)], delta, "rdp")


# privacy.json `extra.noise_source`: where a run's mechanism noise came from.
NOISE_SEEDED = "seeded (simulation, reproducible; not for deployment)"
NOISE_OS_ENTROPY = "os-entropy"


def secure_generator() -> NormalSource:
    """A noise generator nobody can regenerate: a `NormalSource` (numpy's Philox stream per
    block, `dpmed.privacy.normals`) whose seed sequence starts from 128 fresh bits of the OS
    CSPRNG (`secrets`, i.e. os.urandom), a new seed per call.

    Secure enough here because the threat is recomputing the noise: the 128-bit entropy cannot
    be guessed or searched, and a fresh one per release means no stream is reused. Philox is
    not a CSPRNG (its 64-bit block keys could be searched given enough *raw* outputs), but
    the noise is never released alone, only added to the aggregate. Floating-point attacks on
    Gaussian sampling (Mironov 2012) are not addressed; torchcsprng / Opacus secure_mode is
    not installed.
    """
    from dpmed.privacy.normals import NormalSource  # imported on first use

    return NormalSource(secrets.randbits(128))


# torch's CPU generator state (`Generator.get_state`, torch 2.x): the initial seed (8 bytes),
# `left` and `seeded` (4 each), `next` (8), then MT19937's 624 words, one per 8 bytes.
MT_LEFT, MT_WORDS_AT, MT_WORDS = 8, 24, 624


def secret_torch_generator(device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator whose whole state comes from the OS CSPRNG, for noise or samples
    nobody else may reproduce. `manual_seed` would not do on CPU: torch's MT19937 keeps only
    the low 32 bits of a seed, so a secret 63-bit seed leaves 2^32 candidates, few enough to
    search for the noise in a released update. On CPU all 624 state words are drawn (19,968
    bits); on CUDA (Philox, 64-bit seeds) a 64-bit seed. MT19937 is not a CSPRNG (624 raw
    outputs give its state away), so none of its raw draws may leave the node."""
    import numpy as np
    import torch

    generator = torch.Generator(device=device)
    if generator.device.type != "cpu":
        return generator.manual_seed(secrets.randbits(64))
    probe = torch.Generator().manual_seed(5).get_state().numpy()
    if probe[MT_WORDS_AT] != 5 or probe[MT_LEFT] != 1:  # the layout this code writes
        raise RuntimeError(f"torch {torch.__version__}: unknown CPU generator state layout")
    state = probe.copy()
    words = np.frombuffer(secrets.token_bytes(4 * MT_WORDS), dtype="<u4").astype("<u8")
    state[MT_WORDS_AT : MT_WORDS_AT + 8 * MT_WORDS] = words.view(np.uint8)
    state[:MT_LEFT] = 0  # no initial seed to report; `left` = 1: twist before the first draw
    return generator.set_state(torch.from_numpy(state)) or generator


def noise_source(seed: int | None) -> str:
    """privacy.json's `noise_source` of a mechanism given `seed` (None: OS entropy)."""
    return NOISE_OS_ENTROPY if seed is None else NOISE_SEEDED
