"""The in-process, deterministic FeTS federation of one run (paper 000 §III-B/C).

Per round r = 1..T: the selection schedule names the trainers; each trains locally from the
broadcast global model and sends (tensors, n_train); the server aggregates (it never holds a
collaborator object); every collaborator validates the new global model on its own validation
subjects and returns scores; the FeTS timing model gives the round's simulated time and the
projected convergence score advances. Round 0 is the untrained model's validation.

The convergence score is timed as in the FeTS challenge, where collaborators validate the
global model they receive as the first task of the next round: round r's simulated time is
paired with the Dice of the model round r started from (row r − 1: the untrained model for
r = 1). So row r's score covers the Dice of rounds 0..r − 1, and the final model's Dice (row T)
is reported but never scored, as the challenge never validates its last aggregate.

Common random numbers: the initial weights, the selection schedule and each collaborator's local
training (patch order and positions per round) come from the seed block's common seeds
(`dpmed.config.grid.common_seed`, roles init, schedule, local), so runs of one seed that differ
only in aggregator, DP mode or ε0 share them and paired comparisons over seeds pair; only the
server's DP noise is drawn from the job seed (all wildcards), independently per run.

Every round ends with a checkpoint; because every random draw is seeded from (seed, round,
collaborator), a resumed run gives the same results as an uninterrupted one. Outputs in the job
folder: rounds.csv (one row per round: chosen, round and cumulative simulated seconds, Dice,
convergence score, privacy columns of `dpmed.fets.privacy`), selection.csv (one row per chosen
collaborator and round, with its simulated seconds), metrics.json, privacy.json,
resources.json, model.pt (the final global model) and config.json (`dpmed.runtime.run_config`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from dpmed.checkpoint import Checkpoint
from dpmed.config.grid import common_seed
from dpmed.data import fets
from dpmed.fets import collaborator, privacy, round_clock, selection
from dpmed.fets.brats import DICE_KEYS
from dpmed.fets.collaborator import Collaborator, LocalTraining, load_numpy_state, state_to_numpy
from dpmed.fets.grid import server_config
from dpmed.fets.resources import ResourceMeter, Totals
from dpmed.fets.server import Local, RoundMechanisms, Server, ServerConfig
from dpmed.io import write_csv, write_json
from dpmed.models import build_model, save_model
from dpmed.models.resunet3d import count_parameters
from dpmed.runtime import JobContext, Progress
from dpmed.seeding import stable_seed
from dpmed.tracking import tracker

MODEL = "resunet3d"  # the registered 3D residual U-Net (4 modalities in, 4 classes out)


def run(job: JobContext) -> dict[str, Any]:
    """Run (or resume) one fets job; returns metrics.json's content."""
    prepared = prepare(job)
    device, cfg, federation = prepared.device, prepared.server, prepared.federation
    job.write_config("fets", device)
    checkpoint = job.checkpoint("fets")
    run_state = resume(checkpoint, device) or first_state(federation, cfg, device)
    server = Server(cfg)
    rounds = int(job.params["rounds"])
    label = "fets/{aggregator}/{dpmode}/eps{eps}".format(**job.wildcards)
    progress = Progress(label, rounds, start=run_state.round)
    with tracker(job.out_dir, job.tensorboard, "round", run_state.round) as board:
        if run_state.round == 0:
            board.log(run_state.rows[0])
        for fl_round in range(run_state.round + 1, rounds + 1):
            mech = play_round(federation, server, run_state, fl_round)
            checkpoint.save(run_state.saved())
            last = run_state.rows[-1]
            eps_now = None if mech is None else last["eps_basic_cum"]
            progress.line(fl_round, {"WT": last["dice_WT"], "dice": last["dice_mean_labels"],
                                     "score": last["convergence_score"]}, eps_now)  # fmt: skip
            board.log(last)
    metrics = write_outputs(job, cfg, federation, run_state)
    checkpoint.remove()
    return metrics


@dataclass(frozen=True)
class FetsSetup:
    """What a fets job runs before its first round (`prepare`): its device, the server's
    settings (aggregator, DP mode, ε0, noise seed) and the federation."""

    device: torch.device
    server: ServerConfig
    federation: Federation


def prepare(job: JobContext) -> FetsSetup:
    """Start `job` (seeds, device) and build its server settings and federation, drawing every
    seed in the order a run does: the runner, the privacy audit (`dpmed.fets.audit`) and the
    preflight probes (`dpmed.fets.probe`) all start here."""
    device = job.start()
    return FetsSetup(device, server_config(job.params, job.wildcards, job.seed),
                     build_federation(job, device))  # fmt: skip


@dataclass
class Federation:
    """What stays fixed over a run.

    Args:
        model: the global network (initial weights; the final ones are loaded before saving).
        model_arguments: its build arguments (saved with model.pt).
        collaborators: by name, in partition order.
        choices: the selection schedule, one entry per round.
        profiles: the FeTS timing profile of each collaborator, in the challenge's order.
        timed_samples: training samples per subject and epoch the timing model charges
            (`timing_samples_per_subject`).
        training: the local training hyperparameters.
        local_seed: the seed block's seed of local training (common seed, role local); a
            collaborator's round trains from ("fets-local", local_seed, round, name).
    """

    model: nn.Module
    model_arguments: dict[str, Any]
    collaborators: dict[str, Collaborator]
    choices: list[selection.Choice]
    profiles: dict[str, round_clock.TimeProfile]
    timed_samples: int
    training: LocalTraining
    local_seed: int

    @property
    def sizes(self) -> dict[str, tuple[int, int]]:
        """(n_train, n_val) of each collaborator."""
        return {name: (c.n_train, c.n_val) for name, c in self.collaborators.items()}

    def validate(self, state: dict[str, np.ndarray]) -> dict[str, float]:
        """Mean scores over all validation subjects of all collaborators (each validates
        locally), plus the mean Dice over the labels."""
        scores = [s for col in self.collaborators.values() for s in col.validate(state)]
        return collaborator.mean_scores(scores)


def build_federation(job: JobContext, device: torch.device) -> Federation:
    """The network, the collaborators of the processed partitioning sharing one workspace copy
    of it on `device`, the schedule and the timing profiles. Initial weights, schedule and local
    training come from the seed block's common seeds (module docstring); the global RNGs (job
    seed) are left as they were."""
    params = job.params
    training, arguments = LocalTraining.of(params), collaborator.model_arguments(params)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(common_seed("fets", job.wildcards, "init"))
        model = build_model(MODEL, **arguments)
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise ValueError(f"model has buffers {buffers}: no aggregation rule covers them")
    workspace = build_model(MODEL, **arguments).to(device)
    collaborators = [
        Collaborator(str(c.partition_id), job.processed_dir, c.train, c.val, training, workspace,
                     device)
        for c in fets.collaborators(job.processed_dir)
    ]  # fmt: skip
    names = [c.name for c in collaborators]
    choices = selection.schedule([int(n) for n in names], float(params["participation"]),
                                 int(params["rounds"]), params["selection"],
                                 common_seed("fets", job.wildcards, "schedule"))  # fmt: skip
    return Federation(model, arguments, dict(zip(names, collaborators, strict=True)), choices,
                      round_clock.time_profiles(names), int(params["timing_samples_per_subject"]),
                      training, common_seed("fets", job.wildcards, "local"))  # fmt: skip


@dataclass
class TrainState:
    """What a round changes (and a checkpoint holds).

    Args:
        round: rounds completed.
        state: the global model as numpy tensors.
        rows: rounds.csv so far (round 0 first).
        score: the running projected convergence score.
        times: simulated seconds of each (round, chosen collaborator).
        meter: the resource meter (totals over attempts).
    """

    round: int
    state: dict[str, np.ndarray]
    rows: list[dict[str, Any]]
    score: round_clock.ConvergenceScore
    times: dict[tuple[int, int], float]
    meter: ResourceMeter

    def saved(self) -> dict[str, Any]:
        """The checkpoint content."""
        return {"round": self.round, "state": self.state, "rows": self.rows,
                "score": asdict(self.score), "totals": asdict(self.meter.snapshot()),
                "times": self.times}  # fmt: skip


def resume(checkpoint: Checkpoint, device: torch.device) -> TrainState | None:
    """The state after the last completed round of an interrupted run of this job, or None."""
    saved = checkpoint.load()
    if saved is None:
        return None
    print(f"resuming {checkpoint.path.parent} after round {saved['round']}", flush=True)
    state = {name: tensor.numpy() for name, tensor in saved["state"].items()}  # saved as tensors
    return TrainState(saved["round"], state, saved["rows"],
                    round_clock.ConvergenceScore(**saved["score"]), saved["times"],
                    ResourceMeter(device, Totals(**saved["totals"])))  # fmt: skip


def first_state(federation: Federation, cfg: ServerConfig, device: torch.device) -> TrainState:
    """A fresh run: the untrained model and its validation as round 0."""
    state = state_to_numpy(federation.model)
    score, meter = round_clock.ConvergenceScore(), ResourceMeter(device)
    rows = [{"round": 0, "chosen": "", "round_time_s": 0.0, "sim_time_s": 0.0,
             **federation.validate(state), "convergence_score": 0.0,
             **privacy.round_columns(cfg, 0, None)}]  # fmt: skip
    return TrainState(0, state, rows, score, {}, meter)


def play_round(
    federation: Federation, server: Server, run: TrainState, fl_round: int
) -> RoundMechanisms | None:
    """Round `fl_round` (1-based): the chosen collaborators train, the server aggregates, the
    timing model times the round, the score adds that time at the Dice of the model the round
    started from (the module docstring) and every collaborator validates the new model. Appends
    the round's row to `run` and returns its mechanisms (None when non-private)."""
    chosen = [str(c) for c in federation.choices[fl_round - 1].collaborators]
    run.state, mech = aggregate_round(federation, server, run.state, chosen, fl_round)
    times = round_clock.round_times(federation.profiles, federation.sizes, chosen,
                               federation.training.local_epochs, fl_round - 1,
                               federation.timed_samples)  # fmt: skip
    round_time = max(times.values())
    run.times.update({(fl_round, int(name)): t for name, t in times.items() if name in chosen})
    projected = run.score.update(run.rows[-1]["dice_mean_labels"], round_time)
    val = federation.validate(run.state)
    run.rows.append({"round": fl_round, "chosen": ";".join(chosen), "round_time_s": round_time,
                     "sim_time_s": run.score.total_time, **val, "convergence_score": projected,
                     **privacy.round_columns(server.cfg, fl_round, mech)})  # fmt: skip
    run.round = fl_round
    return mech


def aggregate_round(
    federation: Federation,
    server: Server,
    state: dict[str, np.ndarray],
    chosen: list[str],
    fl_round: int,
    extra: Sequence[Local] = (),
) -> tuple[dict[str, np.ndarray], RoundMechanisms | None]:
    """Local training of the `chosen` from the global `state` (each seeded by the federation's
    local seed, the round and its name), then the server's aggregate (the local states are
    freed on return). `extra` (privacy audits only, `dpmed.fets.audit`): further
    (name, state, weight) triples aggregated after the chosen collaborators', as more
    collaborators of the round."""
    local = []
    for name in chosen:
        local_seed = stable_seed("fets-local", federation.local_seed, fl_round, name)
        local_state, weight = federation.collaborators[name].train(state, local_seed)
        local.append((name, local_state, weight))
    return server.aggregate(state, [*local, *extra], fl_round)


def write_outputs(
    job: JobContext, cfg: ServerConfig, federation: Federation, run_state: TrainState
) -> dict[str, Any]:
    """Write the run's output files; returns metrics.json's content."""
    out_dir, rows = job.out_dir, run_state.rows
    write_csv(out_dir / "rounds.csv", pd.DataFrame(rows))
    chosen = selection.selection_frame(federation.choices)
    chosen["sim_time_s"] = [run_state.times[(r, c)] for r, c in zip(chosen["round"],
                            chosen["collaborator"], strict=True)]  # fmt: skip
    write_csv(out_dir / "selection.csv", chosen)
    last = rows[-1]
    rounds = int(job.params["rounds"])
    rejected = int(np.nansum([row["rejected"] for row in rows]))
    priv = privacy.privacy_record(cfg, rounds, last, rejected)
    priv.write(out_dir / "privacy.json", "fets")
    write_json(out_dir / "resources.json", run_state.meter.report(float(last["sim_time_s"])))
    metrics = {
        **{k: last[k] for k in (*DICE_KEYS, "dice_mean_labels")},
        **{k: v for k, v in last.items() if k.startswith("hd95_")},
        "dice_WT_round0": rows[0]["dice_WT"],
        "dice_mean_labels_round0": rows[0]["dice_mean_labels"],
        "best_dice_mean_labels": max(r["dice_mean_labels"] for r in rows),
        "convergence_score": last["convergence_score"],
        "sim_time_s": last["sim_time_s"],
        "rounds": rounds,
        "n_parameters": count_parameters(federation.model),
        "aggregator": cfg.aggregator,
        "dpmode": cfg.dpmode,
        "eps0": job.wildcards["eps"],
        "seed_wildcard": job.wildcards["seed"],
        "epsilon": priv.epsilon,
        "guarantee": priv.guarantee,
    }
    write_json(out_dir / "metrics.json", metrics)
    load_numpy_state(federation.model, run_state.state)
    save_model(out_dir / "model.pt", MODEL, federation.model_arguments, federation.model)
    return metrics
