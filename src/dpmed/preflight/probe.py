"""One cell's probe, run in a child process so that its peak memory is its own:

    python -m dpmed.preflight.probe SPEC.json RESULT.json

SPEC.json: {"probe" (a key of `PROBES`), "study", "wildcards", "params", "seed", "device",
"steps", "config" (the data section is read), "data_dir" (processed stand-in data for fets and
xcal), "work_dir"}.
RESULT.json: the measures below, `status` ok or error with the message, `peak_rss_mb` (the
process's own high-water mark, `dpmed.peak_memory`) and on CUDA `peak_cuda_mb`
(torch.cuda.max_memory_allocated).

Each probe builds the real network at the configured size and steps it through the runner's
own functions (seg: `Plan`, `make_setup`, `train_epoch`; xcal: `build_federation`,
`Client.train_round`, and in a probe of its own the evaluation; fets: `Collaborator.train` and
`Collaborator.validate`, and in a probe of its own `Server.aggregate`), `steps` times, each
step timed; `seconds_per_step` is the median of the steps after the first (the first pays for
allocation and warm-up).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dpmed.io import write_text
from dpmed.peak_memory import peak_rss_bytes
from dpmed.runtime import JobContext

# xcal evaluation is linear in its images: a head is timed and scaled (`probe_xcal_evaluation`).
ROAD_PROBE = 16  # ROAD images timed (of the configured subsample)
EVAL_PROBE = 512  # test images timed (of the test set)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(call: Callable[[], Any], device: torch.device) -> float:
    start = time.perf_counter()
    call()
    _sync(device)
    return time.perf_counter() - start


def steady(times: Sequence[float]) -> float:
    """Seconds per step: the median of the steps after the first (all, if only one)."""
    return float(statistics.median(times[1:] if len(times) > 1 else times))


def _context(spec: dict[str, Any], processed: Path) -> JobContext:
    work = Path(spec["work_dir"])
    return JobContext(processed, work, spec["wildcards"], spec["params"], int(spec["seed"]),
                      spec["device"])  # fmt: skip


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def probe_seg(spec: dict[str, Any]) -> dict[str, Any]:
    """`steps` training steps of the seg runner, one validation batch and one attack batch."""
    from dpmed.preflight.data import seg_data
    from dpmed.seg.attack import image_losses, scoring_batch_size
    from dpmed.seg.data import Split
    from dpmed.seg.evaluate import evaluate
    from dpmed.seg.run import (
        Plan,
        TrainState,
        build_network,
        make_optimizer,
        make_setup,
        sampling_generator,
        train_epoch,
    )
    from dpmed.seg.spec import forward_batch_size

    job = _context(spec, Path(spec["work_dir"]))
    device = job.start()
    dataset = job.wildcards["dataset"]
    data = seg_data(spec["config"]["data"][dataset], dataset, job.seed)
    plan = Plan.of(job, data)
    net, _ = build_network(job, data, device)
    optimizer = make_optimizer(net, dict(job.params))
    state = TrainState()
    setup = make_setup(plan, net, optimizer, data, sampling_generator(job), state)
    batches, times = iter(setup.loader), []
    for _ in range(int(spec["steps"])):
        batch = next(batches, None)
        if batch is None:  # an epoch has fewer batches than the probe's steps
            batches = iter(setup.loader)
            batch = next(batches)
        one = replace(setup, loader=[batch])
        times.append(_timed(lambda one=one: train_epoch(one, plan, state, 0, device), device))
    head = Split(data.splits["val"].images[: plan.batch_size],
                 data.splits["val"].masks[: plan.batch_size])  # fmt: skip
    net.eval()
    eval_batch = forward_batch_size(plan.params)
    evals = [_timed(lambda: evaluate(net, plan.morph, head, data.eval_classes, eval_batch,
                                     device, hd95=False), device) for _ in range(2)]  # fmt: skip
    attack_batch = scoring_batch_size(plan.morph, plan.params)
    part = Split(head.images[:attack_batch], head.masks[:attack_batch])
    weight = float(job.params["dice_weight"])
    attacks = [_timed(lambda: image_losses(net, plan.morph, part, weight, attack_batch, device),
                      device) for _ in range(2)]  # fmt: skip
    return {
        "step_seconds": times,
        "seconds_per_step": steady(times),
        "eval_seconds_per_batch": steady(evals),
        "attack_seconds_per_batch": steady(attacks),
        "attack_batch": attack_batch,
        "sigma": setup.sigma,
        "parameters": _count(net),
    }


def probe_xcal(spec: dict[str, Any]) -> dict[str, Any]:
    """Local DP (or SGD) steps of one sampled client through `Client.train_round` (a first
    round of one step, then a round of `steps` − 1 steps, timed by the client's own step
    clock) and the server's FedAvg. The evaluation is `probe_xcal_evaluation`'s."""
    from dpmed.xcal.run import History, build_federation, fedavg

    job = _context(spec, Path(spec["data_dir"]))
    device = job.start()
    fed = build_federation(job, device)
    history = History({k: v.detach().clone() for k, v in fed.net.state_dict().items()})
    client = fed.clients[fed.schedule[0][0]]
    times, walls = [], []
    for steps in (1, max(1, int(spec["steps"]) - 1)):
        client.steps_per_epoch = steps  # bounded rounds; q and σ stay the configured ones
        done, seconds = client.stats.steps, client.stats.seconds
        walls.append(_timed(lambda: client.train_round(fed.net, fed.wrapped,
                                                       history.global_state), device))  # fmt: skip
        taken = client.stats.steps - done
        times += [(client.stats.seconds - seconds) / max(1, taken)] * taken
        overhead = walls[-1] - (client.stats.seconds - seconds)
    state = {k: v.detach().clone() for k, v in fed.net.state_dict().items()}
    aggregate = _timed(lambda: fed.net.load_state_dict(fedavg([_update(fed, state)])), device)
    return {
        "step_seconds": times,
        "seconds_per_step": steady(times),
        "round_overhead_seconds": overhead + aggregate,
        "sigma": client.sigma_ref or None,
        "parameters": _count(fed.net),
    }


def probe_xcal_evaluation(spec: dict[str, Any]) -> dict[str, Any]:
    """Seconds of one whole-test-set evaluation and one ROAD of the configured subsample of
    the federation's global model, each timed on a head of its images (`EVAL_PROBE`,
    `ROAD_PROBE`) and scaled linearly. The method, shift, clients and ε do not change this
    work, so the xcal cells of one dataset and network share it."""
    from dpmed.xcal.run import build_federation

    job = _context(spec, Path(spec["data_dir"]))
    device = job.start()
    evaluation = build_federation(job, device).evaluation
    head = replace(evaluation, x=evaluation.x[:EVAL_PROBE], y=evaluation.y[:EVAL_PROBE])
    scores = _timed(head.scores, device) * len(evaluation.y) / max(1, len(head.y))
    part = replace(evaluation, road_idx=evaluation.road_idx[:ROAD_PROBE])
    road = _timed(part.road, device) * len(evaluation.road_idx) / max(1, len(part.road_idx))
    return {"eval_seconds": scores, "road_seconds": road}


def _update(fed: Any, state: dict[str, torch.Tensor]) -> Any:
    from dpmed.xcal.client import ClientUpdate

    return ClientUpdate(state, fed.clients[0].n, {})


def probe_fets_collaborators(spec: dict[str, Any]) -> dict[str, Any]:
    """The collaborators' side of a round: two collaborators each train on their two
    subjects (`Collaborator.train`), then one full-volume validation. The server's rule,
    participation and ε0 do not enter, so every fets cell of one network shares this probe."""
    from dpmed.fets.collaborator import state_to_numpy
    from dpmed.fets.run import build_federation

    job = _context(spec, Path(spec["data_dir"]))
    device = job.start()
    federation = build_federation(job, device)
    global_state = state_to_numpy(federation.model)
    batch = int(job.params["batch_size"])
    times, trained = [], global_state
    for collaborator in federation.collaborators.values():
        n_patches = collaborator.n_train * int(job.params["patches_per_subject"])
        steps = math.ceil(float(job.params["local_epochs"]) * n_patches / batch)
        start = time.perf_counter()
        trained, _ = collaborator.train(global_state, 0)
        _sync(device)
        times += [(time.perf_counter() - start) / steps] * steps
    last = list(federation.collaborators.values())[-1]
    validation = _timed(lambda: last.validate(trained), device) / max(1, last.n_val)
    return {
        "step_seconds": times,
        "seconds_per_step": steady(times),
        "val_seconds_per_volume": validation,
        "parameters": _count(federation.model),
    }


def probe_fets_server(spec: dict[str, Any]) -> dict[str, Any]:
    """The server's side of a round: `Server.aggregate` of as many updates as the configured
    participation chooses (DP noise included). The updates are two distinct perturbations of
    the global model, repeated: the aggregate's cost depends on the count and size of the
    updates, not on their values."""
    import numpy as np

    from dpmed.fets.collaborator import state_to_numpy
    from dpmed.fets.run import build_federation, server_config
    from dpmed.fets.server import Server
    from dpmed.job_cost import FETS_PARTITIONS

    job = _context(spec, Path(spec["data_dir"]))
    job.start()
    federation = build_federation(job, torch.device("cpu"))
    global_state = state_to_numpy(federation.model)
    rng = np.random.default_rng(job.seed)
    local = [(name, {k: v + rng.normal(0.0, 1e-3, v.shape).astype(v.dtype)
                     for k, v in global_state.items()}, float(c.n_train))
             for name, c in list(federation.collaborators.items())[:2]]  # fmt: skip
    chosen = max(1, math.floor(float(job.params["participation"]) * FETS_PARTITIONS + 1e-9))
    updates = [local[k % len(local)] for k in range(chosen)]
    server = Server(server_config(job))
    out: list[Any] = []
    aggregate = _timed(lambda: out.append(server.aggregate(global_state, updates, 1)),
                       torch.device("cpu"))  # fmt: skip
    mech = out[0][1]
    return {
        "aggregate_seconds": aggregate,
        "updates": chosen,
        "sigma": None if mech is None else mech.noise_multiplier,
        "parameters": _count(federation.model),
    }


PROBES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "seg": probe_seg,
    "xcal": probe_xcal,
    "xcal_evaluation": probe_xcal_evaluation,
    "fets_collaborators": probe_fets_collaborators,
    "fets_server": probe_fets_server,
}


def run_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """The probe's measures with `status`, or status `error` and the message; peaks added."""
    try:
        result = {"status": "ok", **PROBES[spec["probe"]](spec)}
    except Exception as err:  # noqa: BLE001  (every failure of a cell is reported, not raised)
        traceback.print_exc()
        result = {"status": "error", "message": f"{type(err).__name__}: {err}"}
    result["peak_rss_mb"] = peak_rss_bytes() / 1e6
    result["device"] = "cuda" if spec["device"] != "cpu" and torch.cuda.is_available() else "cpu"
    if result["device"] == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 1e6
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the probe SPEC.json names and write RESULT.json (module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m dpmed.preflight.probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", metavar="SPEC.json", help="the probe to run")
    parser.add_argument("result", metavar="RESULT.json", help="where its result goes")
    args = parser.parse_args(argv)
    spec_path, result_path = args.spec, args.result
    spec = json.loads(Path(spec_path).read_text())
    write_text(result_path, json.dumps(run_probe(spec), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
