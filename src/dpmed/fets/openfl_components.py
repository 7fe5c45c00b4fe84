"""The OpenFL 1.9 plan components of dpmed's FeTS federation (workspace template
deploy/openfl/, launcher `dpmed.fets.openfl_deploy`): `FetsDataLoader`, `FetsTaskRunner`,
`FetsAssigner`, `DPSimAggregation` and `FetsAggregator`. They train, select, aggregate and
validate as `dpmed.fets.run` does (OpenFL counts rounds from 0, the simulation from 1), and the
aggregator's side writes to `<output_dir>`: dp_rounds.jsonl (each released round's privacy
record), released_model.npz (the last released model: OpenFL's last.pbuf holds the model a
round started from), validation.jsonl (each round's validation scores) and dp_failure.txt
(why it stopped the federation). `patch_openfl` changes what OpenFL 1.9 hard-codes that a
local federation must change.

Collaborator names are the FeTS partition ids ("1", "2", ...): the schedule is drawn over them
and each collaborator's training seed includes its name, as in the simulation.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from openfl.component.aggregator.aggregator import Aggregator
from openfl.component.assigner.assigner import Assigner
from openfl.federated.data.loader import DataLoader
from openfl.federated.task.runner import TaskRunner
from openfl.interface.aggregation_functions.experimental import PrivilegedAggregationFunction
from openfl.pipelines.pipeline import Float32NumpyArrayToBytes
from openfl.transport.grpc import common
from openfl.transport.grpc.aggregator_server import AggregatorGRPCServer
from openfl.utilities import TensorKey

from dpmed.data import fets
from dpmed.fets import selection
from dpmed.fets.collaborator import (
    Collaborator,
    LocalTraining,
    load_numpy_state,
    mean_scores,
    model_arguments,
    state_to_numpy,
)
from dpmed.fets.openfl_adapter import fets_dp_simagg, openfl_fetch_round
from dpmed.fets.run import MODEL
from dpmed.models import build_model
from dpmed.runtime import seed_everything, select_device
from dpmed.seeding import stable_seed

TRAIN, VALIDATE = "train", "aggregated_model_validation"
RECORDS, RELEASED, FAILURE = "dp_rounds.jsonl", "released_model.npz", "dp_failure.txt"
VALIDATION = "validation.jsonl"
DICE = "dice_mean_labels"  # the validation metric OpenFL ranks models by (tag validate_agg)
logger = logging.getLogger(__name__)


class FetsDataLoader(DataLoader):
    """One site's processed FeTS data: `data_path` holds splits.csv (one partition) and
    subjects/; None builds an empty loader (`fx plan initialize` needs only the model)."""

    def __init__(self, data_path: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_path = None if data_path is None else Path(data_path)
        self.site: fets.Collaborator | None = None
        if self.data_path is not None:
            sites = fets.collaborators(self.data_path)
            if len(sites) != 1:
                ids = [s.partition_id for s in sites]
                raise ValueError(f"{self.data_path}: splits.csv holds partitions {ids}, expected "
                                 "one (a site's folder holds its own subjects only)")  # fmt: skip
            self.site = sites[0]

    def get_feature_shape(self) -> tuple[int, ...]:
        return (len(fets.MODALITIES),)

    def get_train_data_size(self) -> int:
        return 0 if self.site is None else len(self.site.train)

    def get_valid_data_size(self) -> int:
        return 0 if self.site is None else len(self.site.val)


class FetsTaskRunner(TaskRunner):
    """dpmed's FeTS collaborator as an OpenFL TaskRunner (tasks `train_task`,
    `validate_task`); the optimizer is fresh every round (OpenFL's RESET treatment). The
    initial weights come from `init_seed`, round r's training from `stable_seed("fets-local",
    local_seed, r + 1, name)`; `params`: the plan's network and local training settings
    (`model_arguments`, `LocalTraining.of`)."""

    def __init__(self, data_loader: FetsDataLoader, init_seed: int, local_seed: int,
                 threads: int = 1, device: str = "cpu", **params: Any) -> None:  # fmt: skip
        super().__init__(data_loader)
        seed_everything(local_seed, threads)  # deterministic kernels, the simulation's threads
        self.local_seed, self.device = int(local_seed), select_device(device)
        arguments = model_arguments(params)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(init_seed))
            self.model = build_model(MODEL, **arguments)
        self.names = list(self.model.state_dict())
        training = LocalTraining.of(params)
        site = data_loader.site if data_loader is not None else None
        self.collaborator = None if site is None else Collaborator(
            str(site.partition_id), data_loader.data_path, site.train, site.val, training,
            build_model(MODEL, **arguments).to(self.device), self.device,
        )  # fmt: skip

    def initialize_tensorkeys_for_functions(self, with_opt_vars: bool = False) -> None:
        """Nothing to precompute: both tasks need the whole global model, no optimizer state."""

    def get_required_tensorkeys_for_function(self, func_name: str, **kwargs: Any) -> list:
        return [TensorKey(name, "GLOBAL", 0, False, ("model",)) for name in self.names]

    def get_tensor_dict(self, with_opt_vars: bool = False) -> dict[str, np.ndarray]:
        return state_to_numpy(self.model)

    def set_tensor_dict(self, tensor_dict: dict, with_opt_vars: bool = False) -> None:
        load_numpy_state(self.model, tensor_dict)

    def _site(self) -> Collaborator:
        if self.collaborator is None:
            raise RuntimeError("this task runner has no data (data_path None)")
        return self.collaborator

    def train_task(
        self, col_name: str, round_num: int, input_tensor_dict: dict, **kwargs: Any
    ) -> tuple[dict, dict]:
        """Local training from the round's global model; sends every tensor, tag 'trained'."""
        seed = stable_seed("fets-local", self.local_seed, round_num + 1, col_name)
        state, _ = self._site().train(input_tensor_dict, seed)
        self.set_tensor_dict(state)
        trained = {TensorKey(n, col_name, round_num, False, ("trained",)): state[n]
                   for n in self.names}  # fmt: skip
        return trained, {}

    def validate_task(
        self, col_name: str, round_num: int, input_tensor_dict: dict, **kwargs: Any
    ) -> tuple[dict, dict]:
        """The mean of each score (Dice per label and region, HD95 when on) over this site's
        validation subjects and the mean Dice over the labels, as metrics (no noise)."""
        means = mean_scores(self._site().validate(input_tensor_dict))
        return {TensorKey(k, col_name, round_num, True,
                          ("metric", "validate_agg") if k == DICE else ("metric",)): np.array(v)
                for k, v in means.items()}, {}  # fmt: skip


class FetsAssigner(Assigner):
    """All collaborators validate each round; the round's chosen ones (dpmed's schedule over the
    partition ids, `selection.schedule(ids, participation, rounds, strategy, schedule_seed)`)
    also train, in the schedule's order (the order OpenFL passes them to the aggregation).
    Round `rounds_to_train` (`FetsAggregator`'s last) only validates the final model."""

    def __init__(
        self,
        tasks: dict,
        authorized_cols: list[str],
        rounds_to_train: int,
        participation: float,
        selection_strategy: str,
        schedule_seed: int,
        **kwargs: Any,
    ) -> None:
        self.participation, self.strategy = float(participation), selection_strategy
        self.schedule_seed = int(schedule_seed)
        super().__init__(tasks, [str(c) for c in authorized_cols], rounds_to_train, **kwargs)

    def define_task_assignments(self) -> None:
        if not all(c.isdigit() for c in self.authorized_cols):
            raise ValueError(f"collaborator names {self.authorized_cols} must be the FeTS "
                             "partition ids (the schedule is drawn over them)")  # fmt: skip
        ids = sorted(int(c) for c in self.authorized_cols)
        choices = selection.schedule(ids, self.participation, self.rounds, self.strategy,
                                     self.schedule_seed)  # fmt: skip
        self.chosen = [[str(c) for c in choice.collaborators] for choice in choices]
        self.everyone = [str(c) for c in ids]
        self.all_tasks_in_groups = [VALIDATE, TRAIN]

    def trainers(self, round_number: int) -> list[str]:
        """The collaborators that train in OpenFL's round `round_number` (none in the last)."""
        return list(self.chosen[round_number]) if round_number < self.rounds else []

    def get_tasks_for_collaborator(self, collaborator_name: str, round_number: int) -> list[str]:
        return [VALIDATE, TRAIN] if collaborator_name in self.trainers(round_number) else [VALIDATE]

    def get_collaborators_for_task(self, task_name: str, round_number: int) -> list[str]:
        return self.trainers(round_number) if task_name == TRAIN else list(self.everyone)

    def get_all_tasks_for_round(self, round_number: int) -> list[str]:
        return [VALIDATE, TRAIN] if round_number < self.rounds else [VALIDATE]


class DPSimAggregation(PrivilegedAggregationFunction):
    """`fets_dp_simagg(**settings, first_round=1)` for OpenFL's plan (DP-SimAgg, or another
    private aggregator; `seed` None, a deployment, draws the noise from OS entropy). Once every
    tensor of a round is released, writes its model (replaced atomically) and appends its
    privacy record, naming its trainers (`chosen`, in aggregation order), to `output_dir`."""

    def __init__(self, output_dir: str = "save", mode: str = "sound", **settings: Any) -> None:
        super().__init__()
        self.func = fets_dp_simagg(mode=mode, first_round=1, **settings)
        self.output = Path(output_dir)
        self.round: int | None = None
        self.released: dict[str, np.ndarray] = {}

    def call(
        self, local_tensors: list, tensor_db: Any, tensor_name: str, fl_round: int, tags: tuple
    ) -> np.ndarray:
        out = self.func(local_tensors, tensor_db, tensor_name, fl_round)
        if self.round != fl_round:
            self.round, self.released = fl_round, {}
        self.released[tensor_name] = out
        if set(self.released) == set(self.func.global_state):
            self._write_round()
        return out

    def _write_round(self) -> None:
        """The round is released: its model (atomically replaced) and its privacy record."""
        self.output.mkdir(parents=True, exist_ok=True)
        partial = self.output / f".{RELEASED}"
        with open(partial, "wb") as handle:
            np.savez(handle, **self.released)
        os.replace(partial, self.output / RELEASED)
        record = {**self.func.records[-1], "chosen": list(self.func.weights)}
        append_line(self.output / RECORDS, record)


class FetsAggregator(Aggregator):
    """OpenFL's `Aggregator` that stops the federation instead of waiting forever (OpenFL 1.9
    waits for every collaborator of a round): a round not ended `round_timeout` s after it
    started names the collaborators that have not reported; a round whose uploads lack a tensor
    of the model or hold one it lacks names the collaborator and the tensor (a tensor of another
    shape or with a non-finite entry is screened by `DPSimAggregation` instead). It logs the
    error, writes it to `<output_dir>/dp_failure.txt` and exits with code 1. It runs the
    assigner's validation-only round after the plan's `rounds_to_train` and appends each
    round's validation scores, averaged over the collaborators weighted by their validation
    subjects (the simulation's mean over all subjects), to `<output_dir>/validation.jsonl`:
    OpenFL's round r validates the model released after r rounds."""

    def __init__(self, *args: Any, rounds_to_train: int, round_timeout: float = 300.0,
                 output_dir: str = "save", **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, rounds_to_train=int(rounds_to_train) + 1, **kwargs)
        self.round_timeout, self.output = float(round_timeout), Path(output_dir)
        self._start_timer()

    def _start_timer(self) -> None:
        timer = threading.Timer(self.round_timeout, self._check_stalled, [self.round_number])
        timer.daemon = True
        timer.start()

    def _check_stalled(self, fl_round: int) -> None:
        """Stop when OpenFL's round `fl_round` is still running (the timer's thread)."""
        if self.round_number == fl_round and not self._time_to_quit():
            missing = [c for c in self.authorized_cols if c not in self.collaborators_done]
            self._fail(f"OpenFL round {fl_round}: collaborators {missing} have not reported "
                       f"within the round timeout of {self.round_timeout:g} s (stalled or "
                       "unreachable)")  # fmt: skip

    def _end_of_round_check(self) -> None:
        fl_round = self.round_number
        if not self._end_of_round_check_done[fl_round]:
            chosen = self.assigner.get_collaborators_for_task(TRAIN, fl_round)
            try:
                if chosen:
                    openfl_fetch_round(self.tensor_db, fl_round, chosen, origin=self.uuid)
            except ValueError as err:
                self._fail(f"OpenFL {err}; the round cannot be aggregated")
        super()._end_of_round_check()
        if self.round_number != fl_round and not self._time_to_quit():
            self._start_timer()

    def _compute_validation_related_task_metrics(self, task_name: str) -> dict:
        """OpenFL's weighted average of the task's metrics; the validation's are appended to
        `<output_dir>/validation.jsonl` with OpenFL's round."""
        metrics = super()._compute_validation_related_task_metrics(task_name)
        if task_name == VALIDATE:
            prefix = f"aggregator/{VALIDATE}/"
            scores = {k.removeprefix(prefix): float(v) for k, v in metrics.items()}
            append_line(self.output / VALIDATION, {"round": self.round_number, **scores})
        return metrics

    def _fail(self, error: str) -> None:
        """Log `error`, write it for the launcher and end the aggregator process (exit 1)."""
        logger.error("the federation stops: %s", error)
        self.output.mkdir(parents=True, exist_ok=True)
        (self.output / FAILURE).write_text(error + "\n", encoding="utf-8")
        os._exit(1)


def append_line(path: Path, record: dict) -> None:
    """Append `record` to the JSON-lines file `path` (its folder made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=float) + "\n")


NO_REUSEPORT = ("grpc.so_reuseport", 0)
_server_init = AggregatorGRPCServer.__init__


def _backward(self: Float32NumpyArrayToBytes, data: bytes, metadata: dict, **kwargs) -> np.ndarray:
    """OpenFL's `Float32NumpyArrayToBytes.backward` without the keyword NumPy 2.4 removed."""
    flat = np.frombuffer(data, dtype=np.float32)
    return np.reshape(flat, tuple(metadata["int_list"]), order="C")


def _bound_init(self: AggregatorGRPCServer, *args, bind_addr: str = "[::]", **kwargs) -> None:
    """OpenFL's server init, listening on `bind_addr` (the plan's network setting) only."""
    _server_init(self, *args, **kwargs)
    self.uri = f"{bind_addr}:{self.uri.rpartition(':')[2]}"
    if not self.use_tls:
        print(f"INSECURE: the OpenFL aggregator serves {self.uri} without TLS or client "
              "authentication (network.settings.use_tls false): any process that reaches the "
              "port can join or read the federation", file=sys.stderr, flush=True)  # fmt: skip


def patch_openfl() -> None:
    """Change in OpenFL (idempotent; the workspace template's `deploy/openfl/src/fets.py` calls
    it, so the aggregator and every collaborator do before they serve or decompress a tensor):

    - NumPy >= 2.4: OpenFL's lossless pipeline decompresses every tensor with
      `np.reshape(..., newshape=...)`, a keyword NumPy 2.4 removed; the same reshape without
      it replaces it (same bytes, same float32 array). On older NumPy nothing changes.
    - Binding: `AggregatorGRPCServer` listens on `[::]:<agg_port>`, every interface; the
      plan's `network.settings.bind_addr` (dpmed's key, e.g. 127.0.0.1) names the interface
      instead (absent: OpenFL's `[::]`).
    - A shared port: gRPC sets SO_REUSEPORT, so a second gRPC server on the same port binds
      too and takes part of the collaborators' calls; with `grpc.so_reuseport` 0 the
      aggregator's bind fails at once instead.
    - An aggregator without TLS prints an `INSECURE` warning to stderr when it starts.
    """
    try:
        np.reshape(np.zeros(1), newshape=(1,))
    except TypeError:
        Float32NumpyArrayToBytes.backward = _backward
    AggregatorGRPCServer.__init__ = _bound_init
    if NO_REUSEPORT not in common.DEFAULT_CHANNEL_OPTIONS:
        common.DEFAULT_CHANNEL_OPTIONS = [*common.DEFAULT_CHANNEL_OPTIONS, NO_REUSEPORT]
