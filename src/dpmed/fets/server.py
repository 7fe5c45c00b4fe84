"""The aggregator of the simulation: turns one round's local tensors into the next global model,
and accounts for the privacy of what it released.

`Server.aggregate` receives only (collaborator name, state dict of numpy tensors, data-size
weight) triples and the current global state; data-size weights are normalised to sum 1 over
the round. Noise is drawn from `stable_seed("fets-noise", seed, round)`, so a resumed run draws
the same noise as an uninterrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dpmed.fets import aggregation as agg
from dpmed.privacy import mechanisms
from dpmed.seeding import stable_seed

AGGREGATORS = ("fedavg", "simagg", "dp_simagg", "dp_fedavg")
MODES = {"fedavg": ("none",), "simagg": ("none",), "dp_simagg": ("paper", "sound"),
         "dp_fedavg": ("sound",)}  # fmt: skip


@dataclass(frozen=True)
class ServerConfig:
    """What the aggregator is configured with (no data)."""

    aggregator: str
    dpmode: str
    epsilon0: float | None
    delta0: float
    clip_norm: float
    simagg_distance: str
    sound_calibration: str
    seed: int

    def __post_init__(self) -> None:
        if self.aggregator not in MODES or self.dpmode not in MODES[self.aggregator]:
            raise ValueError(f"aggregator {self.aggregator!r} has no DP mode {self.dpmode!r}")
        if (self.epsilon0 is None) != (self.dpmode == "none"):
            raise ValueError("a finite epsilon0 goes with the DP aggregators only")


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


class Server:
    """Aggregates rounds for one `ServerConfig`."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg

    def sound_sigma(self, n_chosen: int) -> tuple[float, float]:
        """(σ, Δf) of the sound mode's one mechanism per round."""
        cfg = self.cfg
        delta_f = agg.sound_sensitivity(cfg.clip_norm, n_chosen, cfg.aggregator)
        sigma = mechanisms.calibrate(cfg.sound_calibration, delta_f, cfg.epsilon0, cfg.delta0)
        return sigma, delta_f

    def aggregate(
        self, global_state: Mapping[str, np.ndarray], local: Sequence[Local], fl_round: int
    ) -> tuple[dict[str, np.ndarray], RoundMechanisms | None]:
        """The next global state from the round's local states."""
        cfg = self.cfg
        names = [name for name, _, _ in local]
        total = sum(w for _, _, w in local)
        weights = [w / total for _, _, w in local]
        rng = np.random.default_rng(stable_seed("fets-noise", cfg.seed, fl_round))
        if cfg.dpmode == "sound":
            return self._sound(global_state, local, weights, rng)
        out: dict[str, np.ndarray] = {}
        infos: list[agg.MechanismInfo] = []
        for tensor_name in global_state:
            tensors = [state[tensor_name] for _, state, _ in local]
            if cfg.dpmode == "paper":
                out[tensor_name], info = agg.dp_simagg_paper_tensor(
                    tensors, weights, tensor_name, cfg.clip_norm, cfg.epsilon0, cfg.delta0, rng
                )
                infos.append(info)
                continue
            local_tensors = [
                agg.LocalTensor(n, t, w) for n, t, w in zip(names, tensors, weights, strict=True)
            ]
            if cfg.aggregator == "fedavg":
                out[tensor_name] = agg.fedavg(local_tensors, None, tensor_name, fl_round)
            else:
                out[tensor_name] = agg.simagg(
                    local_tensors, None, tensor_name, fl_round, distance=cfg.simagg_distance
                )
        if not infos:
            return out, None
        z = math.sqrt(2.0 * math.log(1.25 / cfg.delta0)) / cfg.epsilon0
        sigmas = [i.sigma for i in infos]
        return out, RoundMechanisms(
            len(infos), max(i.delta_f for i in infos), max(sigmas), min(sigmas), z
        )

    def _sound(
        self,
        global_state: Mapping[str, np.ndarray],
        local: Sequence[Local],
        weights: Sequence[float],
        rng: np.random.Generator,
    ) -> tuple[dict[str, np.ndarray], RoundMechanisms]:
        cfg = self.cfg
        updates = agg.stack_updates(global_state, [state for _, state, _ in local])
        sigma, delta_f = self.sound_sigma(len(local))
        if cfg.aggregator == "dp_simagg":
            step, alpha = agg.dp_simagg_sound(
                updates, weights, cfg.clip_norm, sigma, rng, cfg.simagg_distance, inplace=True
            )
        else:
            step = agg.dp_fedavg(updates, cfg.clip_norm, sigma, rng, inplace=True)
            alpha = np.full(len(local), 1.0 / len(local))
        del updates
        step += agg.flatten_state(global_state)
        new = agg.unflatten_state(step, global_state)
        return new, RoundMechanisms(
            1, delta_f, sigma, sigma, sigma / delta_f, tuple(float(a) for a in alpha)
        )
