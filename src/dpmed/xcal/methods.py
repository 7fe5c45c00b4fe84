"""The xcal methods (paper 001 §5): one registered entry per method.

An entry says what the method is (private or not, federated or centralized, whether it takes a
signal-weight preset) and how a client trains under it: its noise calibration, the per-round
noise allocation, σ_t for each step (`Method.next_sigma`, asked once per step by the client),
ε spent and the privacy.json fields. Each method declares the state it keeps per client
(`FixedSigmaState`, `XCalState`; none for non-private SGD): `calibrate` creates it, the client's
`ClientAccount.state` holds it and only the method's hooks read it.
The config schema's pattern, the `method` wildcard, the grid's validity rules and the report's
method order all read `METHODS`, in registration order.

This module is read when the Snakefile is parsed, so it imports nothing heavy at load time;
the training hooks import what they use when they run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from dpmed.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import nn

    from dpmed.privacy.adaptive import RdpLedger, RenyiFilter
    from dpmed.xcal.account import ClientAccount, SignalDraw
    from dpmed.xcal.calibration import Budget

PRESET_PATTERN = "[a-z0-9]+"
# Roles of the paper's comparisons (report tables and figures): the non-private baseline, the
# DP baseline XCal-FL is measured against, XCal-FL itself and its random-σ_t control (ours).
NON_PRIVATE, BASELINE, PROPOSED, RANDOM_CONTROL = "nondp", "static", "xcal", "xcal-random"
PAPER_POINT = "xcal-paper"  # XCal-FL at the paper's own budget split (s = 1)


@dataclass(slots=True)
class FixedSigmaState:
    """A client's state under a fixed-σ method: the noise multiplier σ_ref that meets the
    target ε and the RDP ledger of the steps taken."""

    sigma_ref: float
    ledger: RdpLedger


@dataclass(slots=True)
class XCalState:
    """A client's XCal-FL state: its calibrated split of the budget s·(ε, δ) (`budget_scale`
    s; the signal's share `eps_signal` at `delta_signal`, the gradients' `eps_grad` at
    `delta_grad`), the signal's and the reference gradient noise multipliers, the Rényi filter
    guarding the gradients (its ledger is the gradient ledger), the signal's ledger and the
    EMA-smoothed signal."""

    budget_scale: float
    eps_signal: float
    delta_signal: float
    eps_grad: float
    delta_grad: float
    sigma_signal: float
    sigma_ref: float
    filter: RenyiFilter
    signal_ledger: RdpLedger
    smoothed: float = 0.5
    schedule: tuple[float, ...] = ()  # the random-σ_t control's σ_1 … σ_T (`XCalRandom`)

    @property
    def ledger(self) -> RdpLedger:
        """The gradient steps' ledger (the filter's)."""
        return self.filter.ledger

    @property
    def steps_taken(self) -> int:
        """Gradient steps charged so far."""
        return sum(int(n) for *_, n in self.ledger.history)


def trained_sigmas(clients: list[ClientAccount]) -> list[float]:
    """The distinct reference σ of the clients that trained (a client the server never sampled
    released nothing)."""
    return sorted({float(c.state.sigma_ref) for c in clients if c.rounds})


@dataclass(frozen=True)
class Method:
    """DP-SGD at the fixed noise multiplier σ_ref that meets the target ε, flat clipping (the
    `static` baseline). Other methods override the hooks they change; every hook gets the
    `ClientAccount` whose `state` (this class: a `FixedSigmaState`) it reads and updates.

    Args:
        private: True: needs a finite ε; False: needs ε = inf; None: either (at ε = inf the
            run trains as `NON_PRIVATE`).
        federated: True: at least 2 clients, any shift; False: one client with the pooled
            data (IID only).
        default_preset: None: the method takes no preset; else the method wildcard may end in
            `-<preset>` naming signal weights (α, β, γ) in the config's `presets`, and the
            bare name uses this one.
        weights: the preset's (α, β, γ) once resolved for a run (`resolve`).
    """

    private: bool | None = True
    federated: bool = True
    default_preset: str | None = None
    weights: tuple[float, ...] | None = None

    dp: ClassVar[bool] = True  # whether the run adds noise (and has a wrapper, a ledger)
    uses_signal: ClassVar[bool] = False  # whether σ_t needs the step's signal (`next_sigma`)
    mechanism: ClassVar[str] = "DP-SGD, Poisson-subsampled Gaussian, flat clipping (per client)"
    # Why the method, as its paper describes it, has no formal guarantee (privacy.json then
    # says "paper-approximation" with this reason); None: its ε is a proven bound.
    paper_flaw: ClassVar[str | None] = None

    def calibrate(self, account: ClientAccount, epsilon: float) -> Any:
        """The client's new state for the target `epsilon`: its noise multiplier(s), empty
        ledger(s)."""
        from dpmed.privacy.adaptive import RdpLedger

        return FixedSigmaState(account.calibrated_sigma(epsilon), RdpLedger())

    def reference_sigma(self, account: ClientAccount) -> float | None:
        """The client's reference noise multiplier σ_ref (None when non-private)."""
        return account.state.sigma_ref

    def halted(self, account: ClientAccount) -> bool:
        """Whether the client has stopped training for good (its budget is spent)."""
        return False

    def round_noise(
        self, account: ClientAccount, model: nn.Module, global_state: Mapping[str, torch.Tensor]
    ) -> dict[str, Any] | None:
        """Noise std by parameter for this round's steps (None: σ_ref·C everywhere)."""
        return None

    def next_sigma(self, account: ClientAccount, signal: SignalDraw | None) -> float | None:
        """σ of the client's next step, charged to its ledger (None: it stops; `signal`: the
        step's raw signal where `uses_signal`)."""
        state: FixedSigmaState = account.state
        state.ledger.charge(account.q, state.sigma_ref)
        return state.sigma_ref

    def epsilon(self, account: ClientAccount) -> float | None:
        """The proven ε bound of the client's releases so far (None when non-private): σ is
        fixed before training, so the RDP of the steps taken is a bound."""
        return account.state.ledger.epsilon(account.delta)

    def realised_epsilon(self, account: ClientAccount) -> float | None:
        """The ε spent so far: the RDP of every mechanism run, composed and converted at δ
        (rounds.csv's `eps_spent`, the ΔF1/Δε trajectory); equals `epsilon` when σ is fixed."""
        return self.epsilon(account)

    def ledger_message(self, account: ClientAccount) -> dict:
        """The ledger part of the client → server message."""
        return {
            "epsilon": self.epsilon(account),
            "eps_realised_reading": self.realised_epsilon(account),
            "gradient": account.state.ledger.state(),
        }

    def checkpoint(self, account: ClientAccount) -> dict:
        """The resumable part of the client's state."""
        return {"ledger": account.state.ledger.state()}

    def restore(self, account: ClientAccount, saved: dict) -> None:
        """Restore what `checkpoint` saved into the client's state."""
        from dpmed.privacy.adaptive import RdpLedger

        account.state.ledger = RdpLedger.from_state(saved["ledger"])

    def privacy_details(
        self, clients: list[ClientAccount], params: Mapping[str, Any]
    ) -> tuple[dict[str, float], list[float], dict[str, Any]]:
        """privacy.json's ε by accountant, noise multipliers and method-specific `extra`."""
        per_client = [float(c.epsilon()) for c in clients]
        return {"rdp": max(per_client)}, trained_sigmas(clients), {}


@dataclass(frozen=True)
class NonPrivate(Method):
    """Plain SGD on the mean cross-entropy (no clipping, no noise): no per-client state."""

    private: bool | None = False
    dp: ClassVar[bool] = False
    mechanism: ClassVar[str] = "none (non-private SGD)"

    def calibrate(self, account: ClientAccount, epsilon: float) -> None:
        return None

    def reference_sigma(self, account: ClientAccount) -> float | None:
        return None

    def epsilon(self, account: ClientAccount) -> float | None:
        return None

    def ledger_message(self, account: ClientAccount) -> dict:
        return {"epsilon": None, "eps_realised_reading": None}

    def checkpoint(self, account: ClientAccount) -> dict:
        return {}

    def restore(self, account: ClientAccount, saved: dict) -> None:
        pass


@dataclass(frozen=True)
class AGP(Method):
    """AGP as paper 001 describes it (related work: fixed-magnitude spatial noise allocation):
    σ_ref·C on every output channel except the top `top_q` share by weight norm of the
    broadcast global model, which gets no noise (`dpmed.xcal.agp`). The ledger charges σ_ref
    per step, the ε of the noised channels; the protected ones have none, hence
    `paper_flaw`."""

    mechanism: ClassVar[str] = (
        "AGP (paper 001's reading): DP-SGD, Poisson-subsampled Gaussian, flat clipping; noise "
        "sigma_ref*C on every output channel except the top_q share by weight norm of the "
        "broadcast global model, which gets none (per client)"
    )
    paper_flaw: ClassVar[str | None] = (
        "AGP as paper 001 describes it (fixed-magnitude spatial noise allocation) adds no noise "
        "to the top_q share of output channels, so the update has no finite epsilon; epsilon "
        "is that of the noised channels (sigma_ref per step); agp-dp is the sound variant "
        "(docs/privacy.md, finding 10)"
    )

    def round_noise(self, account, model, global_state) -> dict[str, Any]:
        from dpmed.privacy.dpsgd import trainable
        from dpmed.xcal.agp import channel_std

        p = account.params
        protected, other = self.channel_stds(account.state.sigma_ref, p)
        return channel_std(global_state, trainable(model), p["top_q"], protected, other)

    def channel_stds(self, sigma_ref: float, params: Mapping[str, Any]) -> tuple[float, float]:
        """Noise std of the protected channels and of the others."""
        return 0.0, sigma_ref * params["clip_norm"]

    def privacy_details(self, clients, params):
        per_client = [float(c.epsilon()) for c in clients]
        extra = {
            "agp_sigma": "top_q channels none, others sigma_ref; accounted at sigma_ref",
            "agp_unnoised_share": params["top_q"],
        }
        return {"rdp_noised_channels": max(per_client)}, trained_sigmas(clients), extra


@dataclass(frozen=True)
class AGPDP(AGP):
    """AGP's sound variant: σ_ref on the top `top_q` output channels of the broadcast global
    model, (1 + b)·σ_ref elsewhere (`dpmed.xcal.agp`); accounted at σ_ref, a proven bound."""

    mechanism: ClassVar[str] = (
        "AGP-DP: DP-SGD, Poisson-subsampled Gaussian, flat clipping; noise sigma_ref*C on the "
        "top_q output channels by weight norm of the broadcast global model, (1+b) sigma_ref*C "
        "on the others (per client)"
    )
    paper_flaw: ClassVar[str | None] = None

    def channel_stds(self, sigma_ref: float, params: Mapping[str, Any]) -> tuple[float, float]:
        clip_norm = params["clip_norm"]
        return sigma_ref * clip_norm, (1 + params["band"]) * sigma_ref * clip_norm

    def privacy_details(self, clients, params):
        by_accountant, noise, extra = Method.privacy_details(self, clients, params)
        extra["agp_sigma"] = (
            "top_q channels sigma_ref, others (1+b) sigma_ref; accounted at sigma_ref"
        )
        return by_accountant, noise, extra


@dataclass(frozen=True)
class XCalFL(Method):
    """XCal-FL: σ_t from the privatised explainability signal under a Rényi filter.

    A calibration budget s·(ε, δ) is split into a signal share f·s·(ε, δ) and a gradient share
    (1 − f)·s·(ε, δ), s chosen so that the proven bound after all planned steps reaches the
    target ε (`dpmed.xcal.calibration`; s = 1, the paper's own point, is `XCalPaper`). Per step, the
    signal s_i (`dpmed.xcal.signal`, sensitivity 1) is summed over its own Poisson sample,
    drawn independently of the gradient step's, and gets N(0, σ_s²); it is divided by q·n,
    clipped to [0, 1] and EMA-smoothed (start 0.5). σ_t follows from the smoothed signal within
    [(1 − b)σ_ref, (1 + b)σ_ref] and the filter admits, raises or halts it so the gradient share
    is never exceeded. Each step is thus two independently subsampled Gaussians, accounted as
    such (one sample for both would be one subsampled mechanism, amplified once). The client's
    state is an `XCalState`.
    """

    default_preset: str | None = "balanced"
    uses_signal: ClassVar[bool] = True
    mechanism: ClassVar[str] = (
        "XCal-FL: Poisson-subsampled Gaussian on the clipped signal sum of its own sample "
        "(sensitivity 1) + DP-SGD (flat clipping) on an independent sample with adaptive "
        "sigma_t under a Renyi filter"
    )

    def budget(self, account: ClientAccount, epsilon: float) -> Budget:
        """The client's split of s·(ε, δ), s calibrated so the proven bound reaches ε."""
        from dpmed.xcal.calibration import calibrate

        p = account.params
        return calibrate(
            epsilon, account.delta, account.q, account.total_steps, p["signal_fraction"], p["band"]
        )

    def calibrate(self, account: ClientAccount, epsilon: float) -> XCalState:
        from dpmed.privacy.adaptive import RdpLedger, RenyiFilter

        f, band, delta = account.params["signal_fraction"], account.params["band"], account.delta
        budget = self.budget(account, epsilon)
        return XCalState(
            budget_scale=budget.scale,
            eps_signal=f * budget.scale * epsilon,
            delta_signal=f * delta,
            eps_grad=(1 - f) * budget.scale * epsilon,
            delta_grad=(1 - f) * delta,
            sigma_signal=budget.sigma_signal,
            sigma_ref=budget.sigma_ref,
            filter=RenyiFilter(
                account.q, budget.order_index, budget.rdp_budget, (1 + band) * budget.sigma_ref
            ),
            signal_ledger=RdpLedger(),
        )

    def halted(self, account: ClientAccount) -> bool:
        return account.state.filter.halted

    def next_sigma(self, account: ClientAccount, signal: SignalDraw | None) -> float | None:
        """σ_t the filter admits for the proposed one (`proposed_sigma`), None once it halts."""
        flt = account.state.filter
        if not flt.can_continue():
            return None
        return flt.admit(self.proposed_sigma(account, signal))

    def proposed_sigma(self, account: ClientAccount, signal: SignalDraw | None) -> float:
        """σ_t the filter is asked for: from the signal privatised (N(0, σ_s²) on its sum,
        charged to the signal ledger), over q·n, clipped to [0, 1] and EMA-smoothed."""
        from dpmed.xcal.signal import sigma_from_signal

        p, state = account.params, account.state
        state.signal_ledger.charge(account.q, state.sigma_signal)
        private = (signal.total + state.sigma_signal * signal.noise) / (account.q * account.n)
        private = min(1.0, max(0.0, private))
        state.smoothed = p["ema"] * state.smoothed + (1 - p["ema"]) * private
        account.stats.signals.append(private)
        return sigma_from_signal(state.smoothed, state.sigma_ref, p["band"])

    def epsilon(self, account: ClientAccount) -> float | None:
        """The proven ε bound at δ of the steps so far: the smaller of `worst_case_epsilon`
        (grows with the rounds) and `filter_epsilon` (the whole run's guarantee)."""
        return min(self.worst_case_epsilon(account), self.filter_epsilon(account))

    def worst_case_epsilon(self, account: ClientAccount) -> float:
        """Every step the schedule allowed so far at the smallest σ the band permits,
        (1 − b)σ_ref, each with its signal step, at δ: a bound whatever the data chose."""
        from dpmed.privacy.adaptive import epsilon_of, rdp_curve

        state: XCalState = account.state
        sigma_min = (1 - account.params["band"]) * state.sigma_ref
        if sigma_min <= 0:
            return math.inf
        steps = account.planned_steps_so_far
        curve = rdp_curve(account.q, sigma_min, steps) + rdp_curve(
            account.q, state.sigma_signal, steps
        )
        return epsilon_of(curve, account.delta)

    def filter_epsilon(self, account: ClientAccount) -> float:
        """The whole run's guarantee at δ (`dpmed.xcal.calibration.filter_bound`: the signal
        over all T planned steps plus the filter's gradient budget), whatever σ_t and halts."""
        from dpmed.xcal.calibration import filter_bound

        state: XCalState = account.state
        return filter_bound(
            account.q,
            state.sigma_signal,
            account.total_steps,
            state.filter.order_index,
            state.filter.budget,
            account.delta,
            account.params["signal_fraction"],
        )

    def realised_epsilon(self, account: ClientAccount) -> float | None:
        """The ε spent so far, accounted as a fixed-σ method's: the signal's and the gradients'
        realised RDP curves summed (independent samples) and converted once at δ. The σ_t
        were chosen from the data, so this is a reading, not a guarantee (summing realised RDP
        of adaptive mechanisms needs a privacy odometer); it never exceeds `epsilon` at the
        end, and the trajectory of ΔF1/Δε uses it like static's spent ε."""
        from dpmed.privacy.adaptive import epsilon_of

        state: XCalState = account.state
        return epsilon_of(state.signal_ledger.rdp + state.ledger.rdp, account.delta)

    def ledger_message(self, account: ClientAccount) -> dict:
        message = super().ledger_message(account)
        message["signal"] = account.state.signal_ledger.state()
        message["halted"] = account.state.filter.halted
        return message

    def checkpoint(self, account: ClientAccount) -> dict:
        state: XCalState = account.state
        return {
            "filter": state.filter.state(),
            "signal_ledger": state.signal_ledger.state(),
            "smoothed": state.smoothed,
        }

    def restore(self, account: ClientAccount, saved: dict) -> None:
        from dpmed.privacy.adaptive import RdpLedger

        state: XCalState = account.state
        state.filter.load_state(saved["filter"])
        state.signal_ledger = RdpLedger.from_state(saved["signal_ledger"])
        state.smoothed = float(saved["smoothed"])

    def privacy_details(self, clients, params):
        sigmas = sorted({round(s, 6) for c in clients for s in c.stats.sigmas})
        states: list[XCalState] = [c.state for c in clients]
        extra = {
            "signal_fraction": params["signal_fraction"],
            "client_calibration_scale": [s.budget_scale for s in states],
            "client_eps_realised_signal": [s.signal_ledger.epsilon(s.delta_signal) for s in states],
            "client_eps_realised_gradient": [s.ledger.epsilon(s.delta_grad) for s in states],
            "client_sigma_signal": [s.sigma_signal for s in states],
            "filter_order": [s.filter.order for s in states],
            "filter_budget_rdp": [s.filter.budget for s in states],
            "filter_spent_rdp": [s.filter.spent() for s in states],
            "filter_raised_steps": [s.filter.raised for s in states],
            "client_halted": [s.filter.halted for s in states],
            "sigma_band": [1 - params["band"], 1 + params["band"]],
        }
        if states and states[0].schedule:
            extra["client_control_sigma_range"] = [
                [min(s.schedule), max(s.schedule)] if s.schedule else [] for s in states
            ]
        by_accountant = {
            "rdp_filter": max(self.filter_epsilon(c) for c in clients),
            "rdp_worst_sigma": max(self.worst_case_epsilon(c) for c in clients),
        }
        noise = [float(min(sigmas)), float(max(sigmas))] if sigmas else []
        return by_accountant, noise, extra


@dataclass(frozen=True)
class XCalPaper(XCalFL):
    """XCal-FL at the paper's own operating point: the target (ε, δ) itself split into the
    signal's and the gradients' shares (s = 1, `dpmed.xcal.calibration.split_budget`). Its
    proven bound ends below the target (about a tenth at f = 0.1); privacy.json records it."""

    def budget(self, account: ClientAccount, epsilon: float) -> Budget:
        from dpmed.xcal.calibration import split_budget

        p = account.params
        return split_budget(
            1.0, epsilon, account.delta, account.q, account.total_steps, p["signal_fraction"],
            p["band"],
        )  # fmt: skip


@dataclass(frozen=True)
class XCalRandom(XCalFL):
    """The random-σ_t control of XCal-FL (ours), matched on steps and budget: XCal-FL's
    calibration (budget split, σ_ref, Rényi filter, bound) with σ_t from a schedule of T
    values drawn before training (`dpmed.xcal.calibration.control_schedule`): uniform draws on
    the top of XCal-FL's band from the client's control generator (never the noise generator:
    the σ_t reach the server, `dpmed.xcal.client`), narrowed so the T steps spend the filter's
    gradient budget, used in their random draw order. So it runs every planned step (draws
    uniform on the whole band would cost more than σ_ref's and halt early) and spends what
    XCal-FL's bound allows. Privacy: the schedule is fixed before training and independent of
    the data, so its exact RDP is a bound, and the filter still guards every step (it never has
    to act). No signal is computed; its share is reserved and charged every step as XCal-FL's
    signal step, so both runs' spent ε and bound count the same budget (an over-count of what
    it releases, which is safe). XCal-FL against it tells whether the signal, rather than σ_t
    merely varying within the band, changes F1 or ROAD."""

    default_preset: str | None = None
    mechanism: ClassVar[str] = (
        "XCal-FL random-sigma control: DP-SGD (flat clipping) with sigma_t from a schedule drawn "
        "uniformly in XCal-FL's band before training, matched to XCal-FL's Renyi filter budget "
        "(never halts); the signal's budget share reserved and charged, no signal computed"
    )

    uses_signal: ClassVar[bool] = False

    def calibrate(self, account: ClientAccount, epsilon: float) -> XCalState:
        """XCal-FL's state plus the T-step σ schedule (T uniform draws of the client's control
        generator, seeded by `account.control_seed`, at construction: a resumed client
        redraws the same)."""
        import torch

        from dpmed.xcal.account import generator
        from dpmed.xcal.calibration import control_schedule

        state = super().calibrate(account, epsilon)
        flt = state.filter
        control = generator(account.control_seed)
        uniforms = torch.rand(account.total_steps, generator=control, dtype=torch.float64)
        schedule = control_schedule(
            uniforms.tolist(), state.sigma_ref, account.params["band"],
            account.q, flt.order, flt.budget,
        )  # fmt: skip
        return replace(state, schedule=tuple(float(s) for s in schedule))

    def proposed_sigma(self, account: ClientAccount, signal: SignalDraw | None) -> float:
        """The schedule's next σ_t; the reserved signal step is charged as XCal-FL's."""
        state: XCalState = account.state
        state.signal_ledger.charge(account.q, state.sigma_signal)
        return state.schedule[state.steps_taken]


METHODS: Registry[Method] = Registry("xcal method")
METHODS.add(NON_PRIVATE, NonPrivate())
METHODS.add("centralized", Method(private=None, federated=False))
METHODS.add(BASELINE, Method())
METHODS.add("agp", AGP())
METHODS.add("agp-dp", AGPDP())
METHODS.add(PROPOSED, XCalFL())
METHODS.add(PAPER_POINT, XCalPaper())
METHODS.add(RANDOM_CONTROL, XCalRandom())


def split_method(method: str) -> tuple[str, str | None]:
    """(registered name, preset) of a method wildcard: `xcal-logit` → (`xcal`, `logit`), `xcal`
    → (`xcal`, its default preset), `static` → (`static`, None), `agp-dp` → (`agp-dp`, None),
    `xcal-paper-logit` → (`xcal-paper`, `logit`): the longest registered name the wildcard
    starts with (a registered name without presets is never read as name and preset)."""
    if method in METHODS and METHODS[method].default_preset is None:
        return method, None
    names = [n for n in METHODS.names() if method == n or method.startswith(f"{n}-")]
    name = max(names, key=len) if names else method.partition("-")[0]
    entry, preset = METHODS[name], method[len(name) + 1 :]
    if entry.default_preset is None:
        if preset:
            raise ValueError(f"xcal method '{name}' takes no preset (got '{method}')")
        return name, None
    return name, preset or entry.default_preset


def method_rank(method: str) -> tuple[int, str]:
    """Sort key of a method wildcard: registration order, then the preset suffix as written
    (the bare name first)."""
    name = split_method(method)[0]
    return METHODS.names().index(name), method[len(name) + 1 :]


def method_regex(group: str = "(?:", end: str = ")") -> str:
    """The alternation of every valid method wildcard (preset suffix where one is taken);
    `group`/`end` open and close the suffix group (`"("`, `")"` for JSON schema)."""
    return "|".join(
        name if entry.default_preset is None else f"{name}{group}-{PRESET_PATTERN}{end}?"
        for name, entry in METHODS.items()
    )


def eps_problem(method: str, private: bool) -> str | None:
    """Why `method` cannot run at a finite (`private`) or infinite ε (None when it can)."""
    entry = METHODS[split_method(method)[0]]
    if entry.private is False and private:
        return f"{method} needs eps inf"
    if entry.private is True and not private:
        return f"{method} is a DP method and needs a finite eps"
    return None


def resolve(method: str, private: bool, presets: Mapping[str, Any]) -> Method:
    """The entry a run of `method` trains with: a method that runs either way trains as
    `NON_PRIVATE` at ε = inf; a preset method carries its preset's weights from `presets`."""
    problem = eps_problem(method, private)
    if problem:
        raise ValueError(problem)
    name, preset = split_method(method)
    if not private and METHODS[name].dp:
        return METHODS[NON_PRIVATE]
    if preset is None:
        return METHODS[name]
    return replace(METHODS[name], weights=tuple(float(w) for w in presets[preset]))
