"""One XCal-FL client: local training by method, its privacy ledger and its message to the server.

Methods (paper 001 §5 baselines): `nondp` (plain SGD), `static` (DP-SGD at the fixed σ_ref that
meets the target ε), `agp` (DP-SGD with less noise on important channels, see `xcal_agp`),
`xcal[-preset]` (σ_t from the privatised explainability signal under a Rényi filter);
`centralized` is one client holding the pooled data, private when ε is finite (then as `static`).

Sampling is Poisson with rate q = 1/S, S = ceil(n/B) steps per local epoch (Opacus' convention:
expected batch q·n ≈ B). A client takes T = rounds · local_epochs · S steps in all; σ_ref (and
XCal's σ_s) are calibrated to T steps at rate q. XCal splits (ε, δ) into a signal share
f·(ε, δ) and a gradient share (1−f)·(ε, δ); the signal sum Σ_i s_i (sensitivity 1) gets
N(0, σ_s²), is divided by q·n, clipped to [0, 1] and EMA-smoothed (start 0.5).
The client sends the server only its model tensors and its ledger (`ClientUpdate`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from dpmed.privacy.accounting import noise_multiplier
from dpmed.privacy.adaptive import RdpLedger, RenyiFilter
from dpmed.xcal import agp as xcal_agp
from dpmed.xcal import signal as xcal_signal
from dpmed.xcal.dpsgd import clipped_grad_sum, noisy_step, plain_step, trainable


@dataclass(frozen=True)
class MethodSpec:
    """What a grid method means for local training."""

    kind: str  # "plain", "static", "agp" or "xcal"
    weights: tuple[float, float, float] | None = None  # (α, β, γ) for xcal


def method_spec(method: str, private: bool, presets: dict) -> MethodSpec:
    """Parse a method wildcard (`xcal` = preset `balanced`)."""
    base, _, preset = method.partition("-")
    if base in ("nondp", "centralized") and not private:
        return MethodSpec("plain")
    if base == "centralized":
        return MethodSpec("static")
    if base in ("static", "agp"):
        return MethodSpec(base)
    if base == "xcal":
        name = preset or "balanced"
        return MethodSpec("xcal", tuple(float(w) for w in presets[name]))
    raise ValueError(f"unknown xcal method '{method}'")


@dataclass
class ClientUpdate:
    """The client → server message: model tensors, sample count and the privacy ledger."""

    tensors: dict[str, torch.Tensor]
    n_samples: int
    ledger: dict


@dataclass
class StepStats:
    """Per-client counters for metrics.json (step times in seconds)."""

    steps: int = 0
    seconds: float = 0.0
    sigmas: list[float] = field(default_factory=list)
    signals: list[float] = field(default_factory=list)


class Client:
    """Local data, sampler and noise generators, ledger(s) and XCal state of one client."""

    def __init__(
        self,
        index: int,
        x: torch.Tensor,
        y: torch.Tensor,
        spec: MethodSpec,
        params: dict,
        epsilon: float,
        seed: int,
        cam_layer: str,
    ) -> None:
        self.index, self.x, self.y, self.spec = index, x, y, spec
        self.params, self.cam_layer = params, cam_layer
        self.n = int(y.shape[0])
        self.steps_per_epoch = math.ceil(self.n / params["batch_size"])
        self.q = 1.0 / self.steps_per_epoch
        self.total_steps = params["rounds"] * params["local_epochs"] * self.steps_per_epoch
        self.sampler = torch.Generator().manual_seed(seed)
        self.noise = torch.Generator(device=x.device).manual_seed(seed + 1)
        self.delta = params["delta"]
        self.ledger = RdpLedger()
        self.signal_ledger = RdpLedger()
        self.filter: RenyiFilter | None = None
        self.smoothed = 0.5
        self.stats = StepStats()
        self.sigma_ref = self.sigma_signal = 0.0
        if spec.kind in ("static", "agp"):
            self.sigma_ref = noise_multiplier(epsilon, self.delta, self.q, self.total_steps)
        if spec.kind == "xcal":
            f = params["signal_fraction"]
            self.eps_signal, self.delta_signal = f * epsilon, f * self.delta
            self.eps_grad, self.delta_grad = (1 - f) * epsilon, (1 - f) * self.delta
            self.sigma_signal = noise_multiplier(
                self.eps_signal, self.delta_signal, self.q, self.total_steps
            )
            self.sigma_ref = noise_multiplier(
                self.eps_grad, self.delta_grad, self.q, self.total_steps
            )
            self.filter = RenyiFilter.for_target(
                self.eps_grad,
                self.delta_grad,
                self.q,
                self.sigma_ref,
                self.total_steps,
                sigma_max=(1 + params["band"]) * self.sigma_ref,
            )
            self.ledger = self.filter.ledger

    # ------------------------------------------------------------------ privacy
    def epsilon(self) -> float | None:
        """ε spent so far: the gradient ledger at δ; XCal adds the signal's ε at δ_s to the
        gradients' at δ_g (sequential composition, total δ = δ_s + δ_g). None if non-private."""
        if self.spec.kind == "plain":
            return None
        if self.spec.kind == "xcal":
            return self.signal_ledger.epsilon(self.delta_signal) + self.ledger.epsilon(
                self.delta_grad
            )
        return self.ledger.epsilon(self.delta)

    def ledger_message(self) -> dict:
        """The ledger part of the client → server message."""
        msg = {"epsilon": self.epsilon(), "gradient": self.ledger.state()}
        if self.spec.kind == "xcal":
            msg["signal"] = self.signal_ledger.state()
            msg["halted"] = self.filter.halted
        return msg

    # ------------------------------------------------------------------ training
    def train_round(
        self, net: nn.Module, wrapped: nn.Module | None, global_state: dict
    ) -> ClientUpdate:
        """Run `local_epochs` epochs from the global model; return the message to the server.

        `net` is the network, `wrapped` its Opacus wrapper (None for non-private methods).
        """
        net.load_state_dict(global_state)
        model = wrapped if wrapped is not None else net
        optimizer = torch.optim.SGD(
            model.parameters(), lr=self.params["lr"], momentum=self.params["momentum"]
        )
        agp_std = None
        if self.spec.kind == "agp":
            agp_std = xcal_agp.channel_noise_std(
                global_state,
                trainable(model),
                self.sigma_ref,
                self.params["band"],
                self.params["top_q"],
                self.params["clip_norm"],
            )
        for _ in range(self.params["local_epochs"] * self.steps_per_epoch):
            if self.filter is not None and self.filter.halted:
                break
            start = time.perf_counter()
            idx = torch.nonzero(torch.rand(self.n, generator=self.sampler) < self.q)[:, 0]
            idx = idx.to(self.x.device)
            xb, yb = self.x[idx], self.y[idx]
            if self.spec.kind == "plain":
                plain_step(model, optimizer, xb, yb)
            elif self.spec.kind == "xcal":
                if not self._xcal_step(model, optimizer, xb, yb):
                    break
            else:
                std = agp_std if agp_std is not None else self._uniform_std(model, self.sigma_ref)
                sums, _ = clipped_grad_sum(model, xb, yb, self.params["clip_norm"])
                noisy_step(model, optimizer, sums, std, self.q * self.n, self.noise)
                self.ledger.charge(self.q, self.sigma_ref)
                self.stats.sigmas.append(self.sigma_ref)
            if self.x.device.type == "cuda":
                torch.cuda.synchronize(self.x.device)
            self.stats.steps += 1
            self.stats.seconds += time.perf_counter() - start
        tensors = {k: v.detach().clone() for k, v in net.state_dict().items()}
        return ClientUpdate(tensors, self.n, self.ledger_message())

    def _uniform_std(self, model: nn.Module, sigma: float) -> dict[str, float]:
        return {name: sigma * self.params["clip_norm"] for name in trainable(model)}

    def _xcal_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor
    ) -> bool:
        """One XCal-FL step; False when the Rényi filter halts the client."""
        flt = self.filter
        if not flt.can_continue():
            return False
        if xb.shape[0]:
            parts = xcal_signal.components(model, self.cam_layer, xb, yb, self.params["top_q"])
            total = float(xcal_signal.combine(parts, self.spec.weights).sum())
        else:
            total = 0.0
        noise = torch.randn((), generator=self.noise, device=self.x.device).item()
        self.signal_ledger.charge(self.q, self.sigma_signal)
        private = min(1.0, max(0.0, (total + self.sigma_signal * noise) / (self.q * self.n)))
        ema = self.params["ema"]
        self.smoothed = ema * self.smoothed + (1 - ema) * private
        proposed = xcal_signal.sigma_from_signal(self.smoothed, self.sigma_ref, self.params["band"])
        sigma = flt.admit(proposed)
        if sigma is None:
            return False
        sums, _ = clipped_grad_sum(model, xb, yb, self.params["clip_norm"])
        noisy_step(
            model, optimizer, sums, self._uniform_std(model, sigma), self.q * self.n, self.noise
        )
        self.stats.sigmas.append(sigma)
        self.stats.signals.append(private)
        return True

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        return {
            "sampler": self.sampler.get_state(),
            "noise": self.noise.get_state(),
            "ledger": self.ledger.state(),
            "signal_ledger": self.signal_ledger.state(),
            "filter": self.filter.state() if self.filter is not None else None,
            "smoothed": self.smoothed,
            "stats": vars(self.stats),
        }

    def load_state(self, state: dict) -> None:
        self.sampler.set_state(state["sampler"].cpu())  # a checkpoint loaded onto CUDA
        self.noise.set_state(state["noise"].cpu())  # moves them; generator states live on CPU
        self.signal_ledger = RdpLedger.from_state(state["signal_ledger"])
        if self.filter is not None:
            self.filter.load_state(state["filter"])
            self.ledger = self.filter.ledger
        else:
            self.ledger = RdpLedger.from_state(state["ledger"])
        self.smoothed = float(state["smoothed"])
        self.stats = StepStats(**state["stats"])
