"""What an XCal-FL node trusts: its site's policy and its own ledger, never the server's plan.

A site writes its `SitePolicy` (a JSON file on the node): the method, target (ε, δ), clip
norm, most rounds and schedule seed it allows. The ClientApp refuses any plan that differs
from it. The `NodeLedger` (a file in the node's state folder) binds the node to one federation
plan and records the rounds it trained and its client's state across Flower runs, so neither
another plan nor a new run id restarts its privacy spending.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from dpmed.config.wildcards import parse_eps
from dpmed.io import atomic_path, write_json
from dpmed.runtime import JobContext

# Where the plan states each policy key (max_rounds bounds the plan's rounds).
PLAN_KEYS = {
    "method": "wildcards.method",
    "eps": "wildcards.eps",
    "delta": "params.delta",
    "clip_norm": "params.clip_norm",
    "max_rounds": "params.rounds",
    "seed": "wildcards.seed",
}
# What a policy key's annotated type admits (a bool is never a number).
KINDS = {"str": (str, "a string"), "float": (float | int, "a number"), "int": (int, "an integer")}


class PlanRefused(RuntimeError):
    """The node refuses the server's plan (its policy or its ledger does not admit it)."""


@dataclass(frozen=True)
class SitePolicy:
    """What a site allows its node to train under; set by the site, never by the server.

    Args:
        method: the xcal method wildcard, e.g. "xcal", "static", "nondp".
        eps: target ε (math.inf: non-private).
        delta: target δ, in (0, 1).
        clip_norm: the per-sample clip norm C (> 0).
        max_rounds: the most federation rounds a plan may have (≥ 1).
        seed: the schedule's seed wildcard the site accepts.
    """

    method: str
    eps: float
    delta: float
    clip_norm: float
    max_rounds: int
    seed: str

    def __post_init__(self) -> None:
        for f in fields(self):
            (kind, called), value = KINDS[f.type], getattr(self, f.name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"policy key {f.name} must be {called}, not {value!r}")
        if not (self.eps > 0 and (math.isfinite(self.eps) or self.eps == math.inf)):
            raise ValueError(f"policy key eps must be > 0 and finite or inf, not {self.eps!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"policy key delta must be in (0, 1), not {self.delta!r}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(f"policy key clip_norm must be finite and > 0, not {self.clip_norm!r}")
        if self.max_rounds < 1:
            raise ValueError(f"policy key max_rounds must be ≥ 1, not {self.max_rounds!r}")

    @classmethod
    def for_job(cls, job: JobContext) -> SitePolicy:
        """The policy that admits exactly `job` (launchers, tests)."""
        return cls(**plan_values(job))

    @classmethod
    def read(cls, path: Path) -> SitePolicy:
        """The policy in the JSON file `path` (ε may be the string "inf"); a ValueError names
        the file and the key at fault."""
        try:
            spec = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"site policy {path}: cannot read it as JSON ({err})") from err
        if not isinstance(spec, dict):
            raise ValueError(f"site policy {path}: must be a JSON object of the policy keys")
        names = [f.name for f in fields(cls)]
        if missing := [k for k in names if k not in spec]:
            raise ValueError(f"site policy {path}: missing key {missing[0]}")
        if unknown := sorted(set(spec) - set(names)):
            raise ValueError(f"site policy {path}: unknown key {unknown[0]} (keys: {names})")
        for key, value in spec.items():  # JSON's 1e999, Infinity and NaN parse to non-finite
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f'site policy {path}: key {key} is {value} (ε inf is "inf")')
        if spec["eps"] == "inf":
            spec["eps"] = math.inf
        try:
            return cls(**spec)
        except ValueError as err:
            raise ValueError(f"site policy {path}: {err}") from err

    def write(self, path: Path) -> None:
        """Write the policy to `path` as `read` reads it (ε inf as "inf"), atomically."""
        spec = asdict(self)
        if spec["eps"] == math.inf:
            spec["eps"] = "inf"
        write_json(path, spec)

    def refusal(self, job: JobContext) -> str | None:
        """Why the node refuses the plan `job` (naming the plan's key, its value and the
        policy's), None if the policy admits it."""
        try:
            plan = plan_values(job)
        except (KeyError, TypeError, ValueError) as err:
            return f"the plan is malformed ({type(err).__name__}: {err})"
        for name, where in PLAN_KEYS.items():
            ours, theirs = getattr(self, name), plan[name]
            if theirs > ours if name == "max_rounds" else theirs != ours:
                verb = "exceeds" if name == "max_rounds" else "differs from"
                return f"the plan's {where} {theirs!r} {verb} the site policy's {name} {ours!r}"
        return None


def plan_values(job: JobContext) -> dict[str, Any]:
    """The values the plan `job` gives the policy's keys (`PLAN_KEYS`), unchecked."""
    wc, params = job.wildcards, job.params
    return {
        "method": str(wc["method"]),
        "eps": parse_eps(str(wc["eps"])),
        "delta": float(params["delta"]),
        "clip_norm": float(params["clip_norm"]),
        "max_rounds": int(params["rounds"]),
        "seed": str(wc["seed"]),
    }


def federation_plan(job: JobContext, model_arguments: dict[str, Any]) -> dict[str, Any]:
    """The plan of a federation, all public: the wildcards, hyperparameters, job seed and
    network arguments of `job` (a node's ledger is bound to it as canonical JSON)."""
    return {
        "wildcards": dict(job.wildcards),
        "params": dict(job.params),
        "seed": int(job.seed),
        "model_arguments": model_arguments,
    }


def differing_keys(a: str, b: str) -> list[str]:
    """The keys (`section.key`) in which two federation plans (canonical JSON) differ."""
    left, right = json.loads(a), json.loads(b)
    keys = []
    for section in sorted(set(left) | set(right)):
        x, y = left.get(section), right.get(section)
        if isinstance(x, dict) and isinstance(y, dict):
            keys += [f"{section}.{k}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        elif x != y:
            keys.append(section)
    return keys


@dataclass
class NodeLedger:
    """A node's record of the one federation plan it trains, kept across Flower runs.

    Args:
        path: its file in the node's state folder (torch.save of plain data).
        plan: the federation plan it is bound to, as canonical JSON (`federation_plan`).
        trained: the 0-based rounds the node trained (an update computed counts, whether or
            not its reply arrived).
        client: the client's state (`dpmed.xcal.client.Client.state`: generators, the method's
            ledgers and Rényi filter, counters); None before the first round.
    """

    path: Path
    plan: str
    trained: list[int] = field(default_factory=list)
    client: dict | None = None

    @classmethod
    def load(cls, path: Path, plan: str) -> NodeLedger:
        """The ledger saved at `path`, or a new one bound to `plan` if there is none."""
        if not path.exists():
            return cls(path, plan)
        try:
            saved = torch.load(path, weights_only=True)
            return cls(path, str(saved["plan"]), list(saved["trained"]), saved["client"])
        except Exception as err:  # fail closed: an unreadable ledger trains nothing
            raise PlanRefused(f"this node's ledger {path} cannot be read ({err})") from err

    def refusal(self, plan: str) -> str | None:
        """Why the ledger refuses `plan` (it belongs to another plan), None if it is its own."""
        if plan == self.plan:
            return None
        keys = ", ".join(differing_keys(self.plan, plan))
        return (
            f"this node's ledger belongs to another federation plan (the plan differs in {keys}); "
            f"the site resets it by removing {self.path}"
        )

    def save(self) -> None:
        """Write the ledger atomically and durably (fsync before the rename)."""
        with atomic_path(self.path) as tmp, open(tmp, "wb") as handle:
            torch.save({"plan": self.plan, "trained": self.trained, "client": self.client}, handle)
            handle.flush()
            os.fsync(handle.fileno())


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock (`<path>.lock`) while the block runs, so that two ClientApps on
    one node (two runs at once) never train from the same ledger state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
