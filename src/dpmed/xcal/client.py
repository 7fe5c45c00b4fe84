"""One XCal-FL client: local training under its method, its privacy ledger and its message to
the server.

Sampling is Poisson with rate q = 1/S, S = ceil(n/B) steps per local epoch (Opacus' convention:
expected batch q·n ≈ B). The server's schedule (`dpmed.xcal.run.client_schedule`) samples the
client in R_k of the rounds; it takes T = R_k · local_epochs · S steps in all, and its noise
multipliers are calibrated to T steps at rate q. How the noise is set is the method's
(`dpmed.xcal.methods`): it creates and alone reads the client's `method_state` (σs, ledgers,
filter); the client knows its method only as a `TrainingMethod`, so this module does not import
the methods, which use it. The client sends the server only its model tensors and its ledger
(`ClientUpdate`).

Its randomness comes from four generators (`ClientSeeds`): the Poisson samples of the gradient
steps and those of XCal-FL's signal are seeded by the run's seed block only, so runs that differ
only in method or ε see the same batches (common random numbers: the sample rate q does not
depend on either); the Gaussian noise comes from the job's own seed, independent per mechanism.
The random-σ_t control's draws come from a fourth generator of the seed block: each σ_t it
draws is sent to the server, so drawn from the noise generator they would give its state away
(some 800 MT19937 outputs at known positions determine it) and with it every noise value.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from dpmed.privacy.accounting import noise_multiplier
from dpmed.privacy.dpsgd import clipped_grad_sum, noisy_step, opacus_clip_factors, trainable
from dpmed.privacy.mechanisms import secret_torch_generator


@dataclass
class ClientUpdate:
    """The client → server message: model tensors, sample count and the privacy ledger."""

    tensors: dict[str, torch.Tensor]
    n_samples: int
    ledger: dict


class StepAudit(Protocol):
    """A privacy audit's hook into the client's DP step (`dpmed.xcal.audit`): it may add
    canary terms to the clipped sums and rescale the noise std before the noisy step."""

    def adjust(
        self,
        model: nn.Module,
        sums: dict[str, torch.Tensor],
        noise_std: dict,
        factors: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[dict[str, torch.Tensor], dict]: ...


class TrainingMethod(Protocol):
    """What a client asks of its method (`dpmed.xcal.methods.Method` and its subclasses): its
    per-client state, its local step and its ledger. Every hook gets the client."""

    def calibrate(self, client: Client, epsilon: float) -> Any: ...

    def halted(self, client: Client) -> bool: ...

    def round_noise(
        self, client: Client, model: nn.Module, global_state: dict
    ) -> dict[str, Any] | None: ...

    def step(
        self,
        client: Client,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        xb: torch.Tensor,
        yb: torch.Tensor,
        noise_std: dict[str, Any] | None,
    ) -> bool: ...

    def epsilon(self, client: Client) -> float | None: ...

    def realised_epsilon(self, client: Client) -> float | None: ...

    def ledger_message(self, client: Client) -> dict: ...

    def checkpoint(self, client: Client) -> dict: ...

    def restore(self, client: Client, saved: dict) -> None: ...


@dataclass(frozen=True)
class ClientSeeds:
    """Seeds of a client's generators: `sampling` (the gradient steps' Poisson samples) and
    `signal` (the signal's own samples), shared by every run of a seed block, `noise` (the
    Gaussian noise), the job's own, and `control` (the random-σ_t control's σ_t, which the
    server sees; 0 for a view that never trains). None: a secret generator drawn from the OS
    CSPRNG (`dpmed.privacy.mechanisms.secret_torch_generator`)."""

    sampling: int | None
    signal: int | None
    noise: int | None
    control: int | None = 0


SECRET_SEEDS = ClientSeeds(None, None, None, None)


def generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator on `device` seeded with `seed`, or a secret one when `seed` is None."""
    if seed is None:
        return secret_torch_generator(device)
    return torch.Generator(device=device).manual_seed(seed)


@dataclass
class StepStats:
    """Per-client counters for metrics.json (step times in seconds)."""

    steps: int = 0
    seconds: float = 0.0
    sigmas: list[float] = field(default_factory=list)
    signals: list[float] = field(default_factory=list)


class Client:
    """Local data, sampler and noise generators, counters and the method's state of one client.

    Its attributes are fixed (`__slots__`): what a method keeps per client lives in
    `method_state`, created by `method.calibrate` and read only by the method's hooks.

    Args:
        index: the client's number.
        x, y: its images (N, C, H, W) in [0, 1] and labels (N,), on the training device.
        method: the run's method (`dpmed.xcal.methods.resolve`).
        params: the job's hyperparameters.
        epsilon: the target ε (inf when non-private).
        seeds: the seeds of its sample and noise generators.
        cam_layer: the network's Grad-CAM layer (XCal-FL's signal).
        planned_rounds: R_k, the rounds the server's schedule samples this client in (None:
            every round).
    """

    __slots__ = (
        "index", "x", "y", "method", "params", "cam_layer", "n", "steps_per_epoch", "q",
        "total_steps", "sampler", "signal_sampler", "noise", "control", "delta", "rounds", "stats",
        "audit", "method_state",
    )  # fmt: skip

    def __init__(
        self,
        index: int,
        x: torch.Tensor,
        y: torch.Tensor,
        method: TrainingMethod,
        params: dict,
        epsilon: float,
        seeds: ClientSeeds,
        cam_layer: str,
        planned_rounds: int | None = None,
    ) -> None:
        self.index, self.x, self.y, self.method = index, x, y, method
        self.params, self.cam_layer = params, cam_layer
        self.n = int(y.shape[0])
        self.steps_per_epoch = math.ceil(self.n / params["batch_size"])
        self.q = 1.0 / self.steps_per_epoch
        rounds = params["rounds"] if planned_rounds is None else planned_rounds
        self.total_steps = rounds * params["local_epochs"] * self.steps_per_epoch
        self.sampler = generator(seeds.sampling)
        self.signal_sampler = generator(seeds.signal)
        self.noise = generator(seeds.noise, x.device)
        self.control = generator(seeds.control)
        self.delta = params["delta"]
        self.rounds = 0
        self.stats = StepStats()
        self.audit: StepAudit | None = None
        self.method_state: Any = method.calibrate(self, epsilon)

    # ------------------------------------------------------------------ privacy
    def epsilon(self) -> float | None:
        """The proven ε bound of everything released so far (None if non-private)."""
        return self.method.epsilon(self)

    def realised_epsilon(self) -> float | None:
        """The realised RDP reading of the steps taken (equals `epsilon` unless the method
        chooses σ adaptively; then it is a reading, not a bound)."""
        return self.method.realised_epsilon(self)

    def calibrated_sigma(self, epsilon: float, delta: float) -> float:
        """The noise multiplier that meets (ε, δ) after this client's T steps at rate q (a
        client the schedule never samples, T = 0, gets that of one step and never uses it)."""
        return noise_multiplier(epsilon, delta, self.q, max(1, self.total_steps))

    # ------------------------------------------------------------------ training
    def train_round(
        self, net: nn.Module, wrapped: nn.Module | None, global_state: dict
    ) -> ClientUpdate:
        """Run `local_epochs` epochs from the global model (a round the server sampled this
        client in); return the message to the server.

        Args:
            net: the network.
            wrapped: its per-sample-gradient wrapper (None for non-private methods).
            global_state: the global model's state dict.
        """
        net.load_state_dict(global_state)
        model = wrapped if wrapped is not None else net
        optimizer = torch.optim.SGD(
            model.parameters(), lr=self.params["lr"], momentum=self.params["momentum"]
        )
        noise_std = self.method.round_noise(self, model, global_state)
        for _ in range(self.params["local_epochs"] * self.steps_per_epoch):
            if self.method.halted(self):
                break
            start = time.perf_counter()
            xb, yb = self.poisson_batch(self.sampler)
            if not self.method.step(self, model, optimizer, xb, yb, noise_std):
                break
            if self.x.device.type == "cuda":
                torch.cuda.synchronize(self.x.device)
            self.stats.steps += 1
            self.stats.seconds += time.perf_counter() - start
        self.rounds += 1
        tensors = {k: v.detach().clone() for k, v in net.state_dict().items()}
        return ClientUpdate(tensors, self.n, self.method.ledger_message(self))

    def poisson_batch(self, sampler: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh Poisson sample of the client's data drawn from `sampler`: each image
        independently with probability q (the sampling the accountant assumes)."""
        idx = torch.nonzero(torch.rand(self.n, generator=sampler) < self.q)[:, 0]
        idx = idx.to(self.x.device)
        return self.x[idx], self.y[idx]

    @property
    def planned_steps_so_far(self) -> int:
        """Steps the schedule allows in the rounds this client trained so far (a halted client
        takes fewer; a round it was not sampled in adds none)."""
        return self.rounds * self.params["local_epochs"] * self.steps_per_epoch

    def uniform_std(self, model: nn.Module, sigma: float) -> dict[str, float]:
        """Noise std σ·C for every parameter."""
        return {name: sigma * self.params["clip_norm"] for name in trainable(model)}

    def dp_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        xb: torch.Tensor,
        yb: torch.Tensor,
        noise_std: dict,
    ) -> None:
        """DP-SGD step: flat-clipped per-sample gradient sum + N(0, std²), over q·n (`audit`, when
        set, adjusts the sums and the std first)."""
        clip_norm = self.params["clip_norm"]

        def factors(norms: torch.Tensor) -> torch.Tensor:
            return opacus_clip_factors(norms, clip_norm)

        sums, _ = clipped_grad_sum(model, xb, yb, factors)
        if self.audit is not None:
            sums, noise_std = self.audit.adjust(model, sums, noise_std, factors)
        noisy_step(model, optimizer, sums, noise_std, self.q * self.n, self.noise)

    def sgd_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor
    ) -> None:
        """Non-private SGD step on the mean cross-entropy of the batch (skipped when empty)."""
        if xb.shape[0] == 0:
            return
        model.train()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(xb), yb).backward()
        optimizer.step()

    def standard_normal(self) -> float:
        """One N(0, 1) draw from the client's noise generator."""
        return torch.randn((), generator=self.noise, device=self.x.device).item()

    def control_uniforms(self, n: int) -> list[float]:
        """`n` U(0, 1) draws from the client's control generator (never the noise one: what
        they choose reaches the server)."""
        return torch.rand(n, generator=self.control, dtype=torch.float64).tolist()

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        """The client's resumable state (generators, the method's state, counters)."""
        return {
            "sampler": self.sampler.get_state(),
            "signal_sampler": self.signal_sampler.get_state(),
            "noise": self.noise.get_state(),
            "control": self.control.get_state(),
            "method": self.method.checkpoint(self),
            "rounds": self.rounds,
            "stats": vars(self.stats),
        }

    def load_state(self, state: dict) -> None:
        """Restore what `state` saved."""
        # a checkpoint loaded onto CUDA moves them; generator states live on CPU
        for name in ("sampler", "signal_sampler", "noise", "control"):
            getattr(self, name).set_state(state[name].cpu())
        self.method.restore(self, state["method"])
        self.rounds = int(state["rounds"])
        self.stats = StepStats(**state["stats"])
