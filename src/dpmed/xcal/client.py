"""One XCal-FL client: local training under its method, its privacy account and its message to
the server.

Sampling is Poisson with rate q = 1/S, S = ceil(n/B) steps per local epoch (Opacus' convention:
expected batch q·n ≈ B). The server's schedule (`dpmed.xcal.federation.client_schedule`) samples
the client in R_k of the rounds; it takes T = R_k · local_epochs · S steps in all, and its noise
multipliers are calibrated to T steps at rate q. How the noise is set is the method's
(`dpmed.xcal.methods`): the client asks it once per round for the noise allocation and once per
step for σ_t (`Method.next_sigma`), and the method keeps its state (σs, ledgers, filter) in
the client's `ClientAccount`, the accounting the server keeps too. The client sends the server
only its model tensors and its ledger (`ClientUpdate`).

Its randomness comes from four generators (`ClientSeeds`): the Poisson samples of the gradient
steps and those of XCal-FL's signal are seeded by the run's seed block only, so runs that differ
only in method or ε see the same batches (common random numbers: the sample rate q does not
depend on either); the Gaussian noise comes from the job's own seed, independent per mechanism.
The random-σ_t control's draws come from a fourth generator of the seed block, used once when
the method is calibrated: each σ_t it draws is sent to the server, so drawn from the noise
generator they would give its state away (some 800 MT19937 outputs at known positions
determine it) and with it every noise value.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from dpmed.privacy.dpsgd import clipped_grad_sum, noisy_step, opacus_clip_factors, trainable
from dpmed.xcal.account import ClientAccount, SignalDraw, StepStats, generator

if TYPE_CHECKING:
    from dpmed.xcal.methods import Method


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


@dataclass(frozen=True)
class ClientSeeds:
    """Seeds of a client's generators: `sampling` (the gradient steps' Poisson samples) and
    `signal` (the signal's own samples), shared by every run of a seed block, `noise` (the
    Gaussian noise), the job's own, and `control` (the random-σ_t control's σ_t, which the
    server sees). None: a secret generator drawn from the OS CSPRNG
    (`dpmed.privacy.mechanisms.secret_torch_generator`)."""

    sampling: int | None
    signal: int | None
    noise: int | None
    control: int | None = 0


SECRET_SEEDS = ClientSeeds(None, None, None, None)


class Client:
    """Local data, sample and noise generators of one client, and its `ClientAccount`.

    Args:
        x, y: its images (N, C, H, W) in [0, 1] and labels (N,), on the training device.
        seeds: the seeds of its sample and noise generators.
        cam_layer: the network's Grad-CAM layer (XCal-FL's signal).
        index, method, params, epsilon, planned_rounds: its account's (`ClientAccount.plan`;
            `method` from `dpmed.xcal.methods.resolve`, `params` the job's hyperparameters).
    """

    __slots__ = ("x", "y", "cam_layer", "sampler", "signal_sampler", "noise", "audit", "account")

    def __init__(
        self,
        index: int,
        x: torch.Tensor,
        y: torch.Tensor,
        method: Method,
        params: dict,
        epsilon: float,
        seeds: ClientSeeds,
        cam_layer: str,
        planned_rounds: int | None = None,
    ) -> None:
        self.x, self.y, self.cam_layer = x, y, cam_layer
        self.sampler = generator(seeds.sampling)
        self.signal_sampler = generator(seeds.signal)
        self.noise = generator(seeds.noise, x.device)
        self.audit: StepAudit | None = None
        self.account = ClientAccount.plan(
            index, int(y.shape[0]), method, params, epsilon, planned_rounds, seeds.control
        )

    # ------------------------------------------------------------------ training
    def train_round(
        self, net: nn.Module, wrapped: nn.Module | None, global_state: dict
    ) -> ClientUpdate:
        """Run `local_epochs` epochs from the global model (a round the server sampled this
        client in): per step a Poisson batch, σ_t from the method (given the step's signal
        where the method uses one; None ends the round) and the DP step (SGD when
        non-private); return the message to the server.

        Args:
            net: the network.
            wrapped: its per-sample-gradient wrapper (None for non-private methods).
            global_state: the global model's state dict.
        """
        account, method, params = self.account, self.account.method, self.account.params
        net.load_state_dict(global_state)
        model = wrapped if wrapped is not None else net
        optimizer = torch.optim.SGD(
            model.parameters(), lr=params["lr"], momentum=params["momentum"]
        )
        round_std = method.round_noise(account, model, global_state)

        def std(sigma: float) -> dict[str, Any]:  # the method's allocation, else σ·C everywhere
            if round_std is not None:
                return round_std
            return {name: sigma * params["clip_norm"] for name in trainable(model)}

        for _ in range(params["local_epochs"] * account.steps_per_epoch):
            if method.halted(account):
                break
            start = time.perf_counter()
            xb, yb = self.poisson_batch(self.sampler)
            if method.dp:
                signal = self.signal(model, method.weights) if method.uses_signal else None
                sigma = method.next_sigma(account, signal)
                if sigma is None:
                    break
                self.dp_step(model, optimizer, xb, yb, std(sigma))
                account.stats.sigmas.append(sigma)
            else:
                self.sgd_step(model, optimizer, xb, yb)
            if self.x.device.type == "cuda":
                torch.cuda.synchronize(self.x.device)
            account.stats.steps += 1
            account.stats.seconds += time.perf_counter() - start
        account.rounds += 1
        tensors = {k: v.detach().clone() for k, v in net.state_dict().items()}
        return ClientUpdate(tensors, account.n, method.ledger_message(account))

    def poisson_batch(self, sampler: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh Poisson sample of the client's data drawn from `sampler`: each image
        independently with probability q (the sampling the accountant assumes)."""
        idx = torch.nonzero(torch.rand(self.account.n, generator=sampler) < self.account.q)[:, 0]
        idx = idx.to(self.x.device)
        return self.x[idx], self.y[idx]

    def signal(self, model: nn.Module, weights: tuple[float, ...]) -> SignalDraw:
        """The step's raw signal (`dpmed.xcal.signal`, weights (α, β, γ)) summed over a Poisson
        sample of the signal sampler, independent of the gradient step's, and its N(0, 1)."""
        from dpmed.xcal import signal

        sx, sy = self.poisson_batch(self.signal_sampler)
        total = 0.0
        if sx.shape[0]:
            parts = signal.components(model, self.cam_layer, sx, sy, self.account.params["top_q"])
            total = float(signal.combine(parts, weights).sum())
        return SignalDraw(total, torch.randn((), generator=self.noise, device=self.x.device).item())

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
        clip_norm = self.account.params["clip_norm"]

        def factors(norms: torch.Tensor) -> torch.Tensor:
            return opacus_clip_factors(norms, clip_norm)

        sums, _ = clipped_grad_sum(model, xb, yb, factors)
        if self.audit is not None:
            sums, noise_std = self.audit.adjust(model, sums, noise_std, factors)
        expected_batch = self.account.q * self.account.n
        noisy_step(model, optimizer, sums, noise_std, expected_batch, self.noise)

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

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        """The client's resumable state (generators, its account's `privacy_state`)."""
        return {
            "sampler": self.sampler.get_state(),
            "signal_sampler": self.signal_sampler.get_state(),
            "noise": self.noise.get_state(),
            **self.account.privacy_state(),
        }

    def load_state(self, state: dict) -> None:
        """Restore what `state` saved."""
        # a checkpoint loaded onto CUDA moves them; generator states live on CPU
        for name in ("sampler", "signal_sampler", "noise"):
            getattr(self, name).set_state(state[name].cpu())
        account = self.account
        account.method.restore(account, state["method"])
        account.rounds = int(state["rounds"])
        account.stats = StepStats(**state["stats"])
