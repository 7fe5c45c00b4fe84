"""The fets server: turns one round's local tensors into the next global model with the run's
registered aggregator and DP mode (`dpmed.fets.aggregation`), and reports the mechanisms it
applied.

`Server.aggregate` receives only (collaborator name, state dict of numpy tensors, data-size
weight) triples and the current global state; data-size weights are normalised to sum 1 over
the round. With a seed (the simulation passes its job seed) noise is drawn from
`stable_seed("fets-noise", seed, round)`, so a resumed run draws the same noise as an
uninterrupted one; without one (a deployment) every round's noise comes from fresh OS entropy
(`dpmed.privacy.mechanisms.secure_generator`), so nobody can regenerate and subtract it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dpmed.fets import aggregation as agg
from dpmed.fets.aggregation import DP_MODES, AggregatorMode, aggregator_mode
from dpmed.fets.round_tensors import RoundTensors
from dpmed.privacy import mechanisms
from dpmed.privacy.normals import NormalSource
from dpmed.seeding import stable_seed


@dataclass(frozen=True)
class ServerConfig:
    """What the aggregator is configured with (no data).

    Args:
        aggregator: a registered aggregator (`dpmed.fets.aggregation.AGGREGATORS`).
        dpmode: one of its DP modes.
        epsilon0: per-round ε0 (None for the non-private mode).
        delta0: per-round δ0.
        clip_norm: C.
        simagg_distance: a `SIMAGG_DISTANCES` name.
        sound_calibration: Gaussian calibration of the whole-model modes (`analytic`, `rdp`).
        seed: the job seed of the noise draws (reproducible simulation); None draws every
            round's noise from OS entropy (deployment).
    """

    aggregator: str
    dpmode: str
    epsilon0: float | None
    delta0: float
    clip_norm: float
    simagg_distance: str
    sound_calibration: str
    seed: int | None

    def __post_init__(self) -> None:
        aggregator_mode(self.aggregator, self.dpmode)  # both registered, the pair supported
        if (self.epsilon0 is None) == DP_MODES[self.dpmode].private:
            raise ValueError("a finite epsilon0 goes with the DP aggregators only")

    @property
    def mode(self) -> AggregatorMode:
        """The registered rule and texts of (aggregator, dpmode)."""
        return aggregator_mode(self.aggregator, self.dpmode)


@dataclass(frozen=True)
class RoundMechanisms:
    """The Gaussian mechanisms of one round: count, largest Δf and σ, smallest σ, σ/Δf."""

    mechanisms: int
    delta_f: float
    sigma: float
    sigma_min: float
    noise_multiplier: float
    alpha: tuple[float, ...] = ()


Local = tuple[str, Mapping[str, np.ndarray], float]


def noise_generator(seed: int | None, *stream: object) -> NormalSource:
    """The noise generator of one release: seeded by ("fets-noise", seed, *stream) when a seed
    is given (reproducible, not for deployment), else fresh OS entropy."""
    if seed is None:
        return mechanisms.secure_generator()
    return NormalSource(stable_seed("fets-noise", seed, *stream, bits=64))


class Server:
    """Aggregates rounds for one `ServerConfig`."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg

    def sound_sigma(self, n_chosen: int) -> tuple[float, float]:
        """(σ, Δf) of a whole-model DP mode's one mechanism per round of `n_chosen` updates."""
        cfg = self.cfg
        delta_f = cfg.mode.sensitivity(cfg.clip_norm, n_chosen)
        sigma = mechanisms.calibrate(cfg.sound_calibration, delta_f, cfg.epsilon0, cfg.delta0)
        return sigma, delta_f

    def generator(self, fl_round: int) -> NormalSource:
        """The noise generator of round `fl_round` (`noise_generator`; a privacy audit's server
        overrides it to scale the noise, `dpmed.privacy.audit.fets`)."""
        return noise_generator(self.cfg.seed, fl_round)

    def aggregate(
        self, global_state: Mapping[str, np.ndarray], local: Sequence[Local], fl_round: int
    ) -> tuple[dict[str, np.ndarray], RoundMechanisms | None]:
        """The next global state from the round's local states, and the round's mechanisms
        (None when no noise was added)."""
        cfg = self.cfg
        total = sum(w for _, _, w in local)
        weights = [w / total for _, _, w in local]
        rng = self.generator(fl_round)
        if DP_MODES[cfg.dpmode].per_tensor:
            return self._per_tensor(global_state, local, weights, rng)
        return self._whole_model(global_state, local, weights, rng)

    def _per_tensor(
        self,
        global_state: Mapping[str, np.ndarray],
        local: Sequence[Local],
        weights: Sequence[float],
        rng: NormalSource,
    ) -> tuple[dict[str, np.ndarray], RoundMechanisms | None]:
        """The rule once per tensor; private modes: one mechanism each."""
        cfg, rule = self.cfg, self.cfg.mode.rule
        private = DP_MODES[cfg.dpmode].private
        names = [name for name, _, _ in local]
        out: dict[str, np.ndarray] = {}
        infos: list[agg.MechanismInfo] = []
        for tensor_name in global_state:
            tensors = [state[tensor_name] for _, state, _ in local]
            local_tensors = [
                agg.LocalTensor(n, t, w) for n, t, w in zip(names, tensors, weights, strict=True)
            ]
            if private:
                out[tensor_name], info = rule(local_tensors, tensor_name, cfg, rng)
                infos.append(info)
            else:
                out[tensor_name] = rule(local_tensors, tensor_name, cfg)
        if not infos:
            return out, None
        sigmas = [i.sigma for i in infos]
        return out, RoundMechanisms(
            len(infos),
            max(i.delta_f for i in infos),
            max(sigmas),
            min(sigmas),
            min(i.noise_multiplier for i in infos),
        )

    def _whole_model(
        self,
        global_state: Mapping[str, np.ndarray],
        local: Sequence[Local],
        weights: Sequence[float],
        rng: NormalSource,
    ) -> tuple[dict[str, np.ndarray], RoundMechanisms]:
        """The rule once on the whole model's updates; one mechanism per round."""
        cfg = self.cfg
        updates = RoundTensors.updates(global_state, [state for _, state, _ in local])
        sigma, delta_f = self.sound_sigma(len(local))
        new, alpha = cfg.mode.rule(updates, weights, cfg, sigma, rng)
        return new, RoundMechanisms(
            1, delta_f, sigma, sigma, sigma / delta_f, tuple(float(a) for a in alpha)
        )
