"""What the xcal ServerApp and ClientApp send each other, as Flower records.

Server → client, per round: `plan` (a ConfigRecord: the job's wildcards, hyperparameters and
seed, the network's build arguments and the round, all public) and `global` (an ArrayRecord:
the global model's state dict). Client → server: `update` (its state dict after local
training) and `report` (its number, sample count, ledger message with its proven ε, and the
ledger state the server's view of the client is restored from; `privacy_state`). Tensors travel
as NumPy .npy bytes (exact for every dtype); the rest as JSON, whose float repr round-trips
exactly. The client's generators never travel.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from dpmed.runtime import JobContext
from dpmed.xcal.client import Client, ClientUpdate, StepStats

PLAN, GLOBAL, UPDATE, REPORT = "plan", "global", "update", "report"


def plan_record(job: JobContext, round_index: int, model_arguments: dict[str, Any]) -> ConfigRecord:
    """The round's plan: what a client needs to build its side of `job` (0-based round)."""
    plan = {
        "wildcards": dict(job.wildcards),
        "params": dict(job.params),
        "seed": int(job.seed),
        "model_arguments": model_arguments,
        "round": round_index,
    }
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


def tensors_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    """A state dict as an ArrayRecord (CPU copies, key order kept)."""
    return ArrayRecord.from_torch_state_dict(tensors)


def record_tensors(record: ArrayRecord, device: torch.device) -> dict[str, torch.Tensor]:
    """The state dict an ArrayRecord holds, on `device` (writable copies)."""
    return {k: v.clone().to(device) for k, v in record.to_torch_state_dict().items()}


def privacy_state(client: Client) -> dict[str, Any]:
    """What the server's view of a client needs for its ε and privacy.json: the method's
    ledger state, rounds trained and step statistics (the σ_t and privatised signals used,
    step counts and times). No generator state: the client's seeds stay on its node."""
    return {
        "method": client.method.checkpoint(client),
        "rounds": client.rounds,
        "stats": asdict(client.stats),
    }


def report_record(client: Client, update: ClientUpdate, noise_source: str) -> ConfigRecord:
    """The client's report beside its update (`noise_source`: how its noise was seeded)."""
    report = {
        "client": client.index,
        "n_samples": update.n_samples,
        "ledger": update.ledger,
        "privacy": privacy_state(client),
        "noise_source": noise_source,
    }
    return ConfigRecord({"json": json.dumps(report)})


def read_report(content: RecordDict) -> dict[str, Any]:
    """A client's report (`report_record`) as a dict."""
    return json.loads(str(content.config_records[REPORT]["json"]))


def restore_view(view: Client, privacy: dict[str, Any]) -> None:
    """Bring the server's view of a client (a `Client` without data) to the state a client's
    `privacy_state` describes."""
    view.method.restore(view, privacy["method"])
    view.rounds = int(privacy["rounds"])
    view.stats = StepStats(**privacy["stats"])
