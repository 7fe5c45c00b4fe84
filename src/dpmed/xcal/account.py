"""A client's privacy account without its data (`ClientAccount`): the plan, the method's state
and the step counters, which a `dpmed.xcal.client.Client` holds and the Flower server keeps per
client from the public plan; and what a method reads from a step (`SignalDraw`). It imports no
other xcal module, so the methods (`dpmed.xcal.methods`) and the client both read it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from dpmed.privacy.accounting import noise_multiplier
from dpmed.privacy.mechanisms import secret_torch_generator


class Policy(Protocol):
    """What an account asks its method (`dpmed.xcal.methods.Method`)."""

    def calibrate(self, account: ClientAccount, epsilon: float) -> Any: ...
    def epsilon(self, account: ClientAccount) -> float | None: ...
    def realised_epsilon(self, account: ClientAccount) -> float | None: ...
    def checkpoint(self, account: ClientAccount) -> dict: ...


@dataclass(frozen=True)
class SignalDraw:
    """One step's raw XCal-FL signal: Σ_i s_i over the client's own Poisson sample and one
    N(0, 1) draw of its noise generator (the method scales it by σ_s)."""

    total: float
    noise: float


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


@dataclass(eq=False)
class ClientAccount:
    """A client's privacy accounting without its data: the plan (n samples, S steps per epoch,
    T planned steps), the method's state (σs, ledgers, filter; `dpmed.xcal.methods`), the
    rounds trained and the step counters; sampling is Poisson at rate q = 1/S. A `Client` holds
    one; the Flower server keeps one per client from the public plan and the roll call's sample
    count."""

    index: int
    n: int
    method: Policy
    params: dict
    steps_per_epoch: int
    q: float
    total_steps: int
    control_seed: int | None = 0
    state: Any = None  # the method's: FixedSigmaState, XCalState (dpmed.xcal.methods) or None
    rounds: int = 0
    stats: StepStats = field(default_factory=StepStats)

    @classmethod
    def plan(
        cls,
        index: int,
        n: int,
        method: Policy,
        params: dict,
        epsilon: float,
        planned_rounds: int | None = None,
        control_seed: int | None = 0,
    ) -> ClientAccount:
        """Client `index`'s account for `n` samples, the method calibrated to the target
        `epsilon` over R_k = `planned_rounds` rounds (None: every round); `control_seed`
        seeds the random-σ_t control's draws (`ClientSeeds.control`)."""
        steps_per_epoch = math.ceil(n / params["batch_size"])
        rounds = params["rounds"] if planned_rounds is None else planned_rounds
        total = rounds * params["local_epochs"] * steps_per_epoch
        account = cls(
            index, n, method, params, steps_per_epoch, 1.0 / steps_per_epoch, total, control_seed
        )
        account.state = method.calibrate(account, epsilon)
        return account

    @property
    def delta(self) -> float:
        """The target δ."""
        return self.params["delta"]

    @property
    def planned_steps_so_far(self) -> int:
        """Steps the schedule allows in the rounds this client trained so far (a halted client
        takes fewer; a round it was not sampled in adds none)."""
        return self.rounds * self.params["local_epochs"] * self.steps_per_epoch

    def epsilon(self) -> float | None:
        """The proven ε bound of everything released so far (None if non-private)."""
        return self.method.epsilon(self)

    def realised_epsilon(self) -> float | None:
        """The realised RDP reading of the steps taken (equals `epsilon` unless the method
        chooses σ adaptively; then it is a reading, not a bound)."""
        return self.method.realised_epsilon(self)

    def calibrated_sigma(self, epsilon: float) -> float:
        """The noise multiplier that meets (ε, δ) after T steps at rate q (a client the
        schedule never samples, T = 0, gets that of one step and never uses it)."""
        return noise_multiplier(epsilon, self.delta, self.q, max(1, self.total_steps))

    def privacy_state(self) -> dict[str, Any]:
        """The method's ledger state, rounds trained and step statistics (no generators)."""
        return {
            "method": self.method.checkpoint(self),
            "rounds": self.rounds,
            "stats": asdict(self.stats),
        }
