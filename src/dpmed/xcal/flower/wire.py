"""What the xcal ServerApp and ClientApp send each other, as Flower records, and how the server
reads a client's report without trusting it.

Server → client, per round: `plan` (a ConfigRecord: the job's wildcards, hyperparameters and
seed, the network's build arguments and the round, all public) and `global` (an ArrayRecord:
the global model's state dict). Client → server: `update` (its state dict after local
training) and `report` (its number, sample count, ledger message with its proven ε, and its
ledger state and step statistics; `ClientAccount.privacy_state`). Tensors travel as NumPy .npy
bytes (exact for every dtype); the rest as JSON, whose float repr round-trips exactly. The client's
generators never travel. Every read of a report raises `Refused`, naming the field at fault,
on anything missing, malformed or non-finite.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from dpmed.privacy.accounting import ORDERS
from dpmed.privacy.adaptive import RdpLedger
from dpmed.runtime import JobContext
from dpmed.xcal.account import ClientAccount, StepStats
from dpmed.xcal.client import Client, ClientUpdate
from dpmed.xcal.flower.policy import federation_plan
from dpmed.xcal.methods import FixedSigmaState

PLAN, GLOBAL, UPDATE, REPORT = "plan", "global", "update", "report"


class Refused(ValueError):
    """A client's reply the server refuses; the message is "`where`: `reason`", `where` the
    report field or the tensor at fault."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")


def plan_record(job: JobContext, round_index: int, model_arguments: dict[str, Any]) -> ConfigRecord:
    """The round's plan: what a client needs to build its side of `job` (the federation plan,
    `policy.federation_plan`, and the 0-based round)."""
    plan = {**federation_plan(job, model_arguments), "round": round_index}
    return ConfigRecord({"json": json.dumps(plan)})


def read_plan(
    content: RecordDict, data_dir: Path, device: str, threads: int | None
) -> tuple[JobContext, dict[str, Any], int]:
    """(the client's JobContext on its own `data_dir`, the network's arguments, the round)."""
    plan = json.loads(str(content.config_records[PLAN]["json"]))
    job = JobContext(
        processed_dir=data_dir,
        out_dir=data_dir,  # a client writes nothing
        wildcards=plan["wildcards"],
        params=plan["params"],
        seed=plan["seed"],
        device=device,
        threads=threads,
    )
    return job, plan["model_arguments"], int(plan["round"])


def record_tensors(record: ArrayRecord, device: torch.device) -> dict[str, torch.Tensor]:
    """The state dict an ArrayRecord holds, on `device` (writable copies); Refused when its
    arrays cannot be read."""
    try:
        state = record.to_torch_state_dict()
    except (TypeError, ValueError) as err:
        raise Refused(UPDATE, f"unreadable arrays ({err})") from None
    return {k: v.clone().to(device) for k, v in state.items()}


def report_record(client: Client, update: ClientUpdate, noise_source: str) -> ConfigRecord:
    """The client's report beside its update (`noise_source`: how its noise was seeded)."""
    report = {
        "client": client.account.index,
        "n_samples": update.n_samples,
        "ledger": update.ledger,
        "privacy": client.account.privacy_state(),
        "noise_source": noise_source,
    }
    return ConfigRecord({"json": json.dumps(report)})


def read_report(content: RecordDict, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """A client's report (`report_record`, or the roll call's answer) as a dict holding at
    least `keys`; Refused when it is missing, not a JSON object or lacks one of them."""
    record = content.config_records.get(REPORT)
    if record is None or "json" not in record:
        raise Refused(REPORT, "missing from the reply")
    try:
        report = json.loads(str(record["json"]))
    except ValueError as err:
        raise Refused(REPORT, f"not JSON ({err})") from None
    if not isinstance(report, dict):
        raise Refused(REPORT, "not a JSON object")
    if missing := [k for k in keys if k not in report]:
        raise Refused(missing[0], "missing from the report")
    return report


def integer(value: Any, where: str) -> int:
    """`value` when it is a JSON integer, else Refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused(where, f"{value!r} is not an integer")
    return value


def number(value: Any, where: str) -> float:
    """`value` as a float when it is a finite JSON number, else Refused."""
    try:
        finite = not isinstance(value, bool) and isinstance(value, int | float)
        finite = finite and math.isfinite(value)
    except OverflowError:  # an integer beyond float's range
        finite = False
    if not finite:
        raise Refused(where, f"{value!r} is not a finite number")
    return float(value)


def mapping(value: Any, where: str) -> dict[str, Any]:
    """`value` when it is a JSON object, else Refused."""
    if not isinstance(value, dict):
        raise Refused(where, "missing or not a JSON object")
    return value


def rdp_ledger(value: Any, where: str) -> RdpLedger:
    """The ledger a report's `RdpLedger.state()` describes: its RDP curve, one finite value ≥ 0
    per accountant order, and its charges [σ > 0, q in (0, 1], steps ≥ 1]; else Refused."""
    state = mapping(value, where)
    rdp, history = state.get("rdp"), state.get("history")
    if not isinstance(rdp, list) or len(rdp) != len(ORDERS):
        raise Refused(f"{where}.rdp", f"not a list of {len(ORDERS)} values (one per order)")
    curve = np.array([number(v, f"{where}.rdp") for v in rdp])
    if np.any(curve < 0):
        raise Refused(f"{where}.rdp", "a negative RDP value")
    if not isinstance(history, list):
        raise Refused(f"{where}.history", "not a list of charges")
    charges = []
    for entry in history:
        if not isinstance(entry, list) or len(entry) != 3:
            raise Refused(f"{where}.history", f"{entry!r} is not [sigma, q, steps]")
        sigma, q = number(entry[0], f"{where}.history"), number(entry[1], f"{where}.history")
        steps = integer(entry[2], f"{where}.history")
        if not (sigma > 0 and 0 < q <= 1 and steps >= 1):
            raise Refused(f"{where}.history", f"{entry!r} is not a charge [sigma, q, steps]")
        charges.append([sigma, q, steps])
    return RdpLedger(curve, charges)


def step_stats(value: Any, where: str) -> StepStats:
    """The `StepStats` a report's statistics describe (counts ≥ 0, finite readings), else
    Refused."""
    state = mapping(value, where)
    names = [f.name for f in fields(StepStats)]
    if sorted(state) != sorted(names):
        raise Refused(where, f"keys {sorted(state)}, not {sorted(names)}")
    steps, seconds = integer(state["steps"], f"{where}.steps"), number(state["seconds"], where)
    if steps < 0 or seconds < 0:
        raise Refused(where, f"negative steps {steps} or seconds {seconds}")
    readings = {}
    for name in ("sigmas", "signals"):
        if not isinstance(state[name], list):
            raise Refused(f"{where}.{name}", "not a list")
        readings[name] = [number(v, f"{where}.{name}") for v in state[name]]
    return StepStats(steps, seconds, **readings)


def restore_readings(view: ClientAccount, privacy: dict[str, Any]) -> None:
    """Bring the server's view of a client (its `ClientAccount`) to the readings a checked
    report's `ClientAccount.privacy_state` gives: its step statistics and, where its ε does
    not depend on them, the method's ledgers (XCal-FL's filter and signal ledgers). Never its
    round count, calibration or a fixed-σ ledger: the server keeps those itself."""
    if not isinstance(view.state, FixedSigmaState):
        view.method.restore(view, privacy["method"])
    view.stats = step_stats(privacy["stats"], "privacy.stats")
