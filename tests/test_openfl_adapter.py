"""The FeTS-challenge adapter inside a real OpenFL 1.9 aggregator.

A real `openfl.component.aggregator.Aggregator` runs whole rounds: collaborators' uploads are
built by OpenFL's own `Collaborator.nparray_to_named_tensor` (deltas, compression) and go
through `process_task_results` -> `_process_named_tensor` -> `TensorDB.cache_tensor`; the end of
the round calls `TensorDB.get_aggregated_tensor` with the challenge's privileged
`CustomAggregationWrapper`, which calls the adapter with six arguments. Everything an OpenFL
aggregator keeps (previous rounds until `clean_up`, metrics, aggregates) is in the table.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from openfl.component.aggregator.aggregator import Aggregator
from openfl.component.collaborator.collaborator import Collaborator
from openfl.databases import TensorDB
from openfl.interface.aggregation_functions.experimental import PrivilegedAggregationFunction
from openfl.pipelines import NoCompressionPipeline, STCPipeline, TensorCodec
from openfl.pipelines.pipeline import Float32NumpyArrayToBytes
from openfl.utilities import SingletonABCMeta, TensorKey, change_tags

from dpmed.fets.openfl_adapter import fets_dp_simagg
from dpmed.fets.server import Server, ServerConfig

# OpenFL's plan names the aggregator `aggregator_<federation_uuid>`; the 2021-22 challenge code
# overrides it to 'aggregator'.
PLAN_UUID = "aggregator_fets_challenge_1a2b3c4d"
COLS = {"1": 40, "2": 25, "ucl": 35}  # collaborator: data size ('ucl' sorts after 'trained')
SHAPES = {"enc.conv.weight": (4, 3), "enc.norm.bias": (4,), "head.weight": (2, 4)}
VALIDATE, TRAIN = "aggregated_model_validation", "train"
# The records' RDP ε at ε0 = 1e9 (negligible noise) sits at the smallest order: expected here.
pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")


class CustomAggregationWrapper(PrivilegedAggregationFunction):
    """The challenge's wrapper (FeTS-AI/Challenge Task_1/fets_challenge/
    custom_aggregation_wrapper.py), as it is: privileged, so OpenFL passes it the TensorDB
    frame; it drops OpenFL's `tags` and calls the user's function with six arguments."""

    def __init__(self, func):
        super().__init__()
        self.func = func
        self.collaborators_chosen_each_round = None
        self.collaborator_times_per_round = None

    def set_state_data_for_round(self, collaborators_chosen_each_round, collaborator_times):
        self.collaborators_chosen_each_round = collaborators_chosen_each_round
        self.collaborator_times_per_round = collaborator_times

    def call(self, local_tensors, tensor_db, tensor_name, fl_round, *__):
        return self.func(
            local_tensors,
            tensor_db,
            tensor_name,
            fl_round,
            self.collaborators_chosen_each_round,
            self.collaborator_times_per_round,
        )


class ChallengeAssigner:
    """The challenge's FeTSChallengeAssigner plus `is_task_group_evaluation` (OpenFL 1.9): all
    collaborators validate the global model, the round's chosen ones also train."""

    def __init__(self, wrapper: CustomAggregationWrapper, chosen: dict[int, list[str]]) -> None:
        self.tasks = {VALIDATE: {}, TRAIN: {"aggregation_type": wrapper}}
        self.chosen = chosen

    def is_task_group_evaluation(self) -> bool:
        return False

    def get_tasks_for_collaborator(self, col: str, fl_round: int) -> list[str]:
        return [VALIDATE, TRAIN] if col in self.chosen[fl_round] else [VALIDATE]

    def get_collaborators_for_task(self, task: str, fl_round: int) -> list[str]:
        return list(self.chosen[fl_round]) if task == TRAIN else list(COLS)

    def get_all_tasks_for_round(self, fl_round: int) -> list[str]:
        return [VALIDATE, TRAIN]

    def get_aggregation_type_for_task(self, task: str):
        return self.tasks[task].get("aggregation_type")


@pytest.fixture(autouse=True)
def numpy_24_reshape(monkeypatch):
    """OpenFL 1.9 decompresses with `np.reshape(..., newshape=...)`, a keyword NumPy 2.4
    removed; the same call without it, so the real pipelines run on our NumPy."""

    def backward(self, data, metadata, **kwargs):
        flat = np.frombuffer(data, dtype=np.float32)
        return np.reshape(flat, tuple(metadata["int_list"]), order="C")

    monkeypatch.setattr(Float32NumpyArrayToBytes, "backward", backward)


@pytest.fixture
def wrap():
    """A fresh challenge wrapper around a function. OpenFL aggregation functions are singletons
    per class (SingletonABCMeta): a second CustomAggregationWrapper(f) would keep the first f."""

    def make(func) -> CustomAggregationWrapper:
        SingletonABCMeta._instances.pop(CustomAggregationWrapper, None)
        wrapper = CustomAggregationWrapper(func)
        assert wrapper.func is func
        return wrapper

    yield make
    SingletonABCMeta._instances.pop(CustomAggregationWrapper, None)


class Recorder:
    """Wraps an aggregation function: keeps what OpenFL passed it and what it returned."""

    def __init__(self, func) -> None:
        self.func, self.calls = func, []

    def __call__(self, local_tensors, tensor_db, tensor_name, fl_round, chosen, times):
        out = self.func(local_tensors, tensor_db, tensor_name, fl_round, chosen, times)
        local = [(t.col_name, np.array(t.tensor), t.weight) for t in local_tensors]
        self.calls.append((fl_round, tensor_name, local, np.array(out)))
        return out


def upload(aggregator, col, fl_round, trained, deltas, pipeline, drop=()):
    """Collaborator `col`'s round: a validation metric, and if chosen its trained tensors (less
    `drop`), built by OpenFL's Collaborator.nparray_to_named_tensor from a local TensorDB that
    holds the global model it downloaded."""
    me = SimpleNamespace(
        tensor_db=TensorDB(), tensor_codec=TensorCodec(pipeline), use_delta_updates=deltas
    )
    send = Collaborator.nparray_to_named_tensor
    metric = send(me, TensorKey("valid_dice", col, fl_round, True, ("metric", "validate_agg")),
                  np.array(0.5))  # fmt: skip
    aggregator.process_task_results(col, fl_round, VALIDATE, COLS[col], [metric])
    if trained is None:
        return
    named = []
    for name, value in trained.items():
        model = aggregator.tensor_db.get_tensor_from_cache(
            TensorKey(name, aggregator.uuid, fl_round, False, ("model",))
        )
        me.tensor_db.cache_tensor({TensorKey(name, col, fl_round, False, ("model",)): model})
        if name not in drop:
            named.append(send(me, TensorKey(name, col, fl_round, False, ("trained",)), value))
    aggregator.process_task_results(col, fl_round, TRAIN, COLS[col], named)


def federation(tmp_path, wrapper, chosen, *, deltas=False, lossy=False, uuid=PLAN_UUID):
    """A real OpenFL 1.9 aggregator (db_store_rounds=2: it keeps the previous round)."""
    rng = np.random.default_rng(0)
    initial = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    pipeline = STCPipeline() if lossy else NoCompressionPipeline()
    aggregator = Aggregator(
        uuid, "fets_challenge_1a2b3c4d", list(COLS), None,
        str(tmp_path / "best.pbuf"), str(tmp_path / "last.pbuf"),
        ChallengeAssigner(wrapper, chosen), use_delta_updates=deltas,
        rounds_to_train=len(chosen), compression_pipeline=pipeline, db_store_rounds=2,
        initial_tensor_dict=initial, persist_checkpoint=False, callbacks=[],
    )  # fmt: skip
    return aggregator, pipeline


def global_model(aggregator, fl_round):
    """Round `fl_round`'s global model, looked up with OpenFL's own exact-key reader."""
    return {
        n: aggregator.tensor_db.get_tensor_from_cache(
            TensorKey(n, aggregator.uuid, fl_round, False, ("model",))
        )
        for n in SHAPES
    }


def run_rounds(aggregator, pipeline, chosen, values, deltas=False):
    """Every round of `chosen`; the chosen collaborators train to `values(round, rng, shape)`.
    Returns each round's global model and uploads."""
    rng = np.random.default_rng(1)
    models, uploads = {}, {}
    for fl_round, cols in chosen.items():
        models[fl_round] = global_model(aggregator, fl_round)
        uploads[fl_round] = {
            c: {n: values(fl_round, rng, s).astype(np.float32) for n, s in SHAPES.items()}
            for c in cols
        }
        for col in COLS:
            upload(aggregator, col, fl_round, uploads[fl_round].get(col), deltas, pipeline)
    return models, uploads


def issue_values(fl_round, rng, shape):
    """Round 2's models near 5.343, round 3's in [0.1, 0.3] (the issue's report)."""
    if fl_round == 3:
        return rng.uniform(0.1, 0.3, shape)
    return 5.343 + 0.01 * rng.standard_normal(shape)


def issue_tensor_db(uuid: str = PLAN_UUID) -> tuple[TensorDB, dict, dict]:
    """The issue's table: rounds 2 and 3 as OpenFL 1.9's aggregator caches them without deltas
    or compression (`test_openfl_writes_these_keys` checks the keys); round 3's global model
    is round 2's aggregate, near 5.343. Returns the table, round 3's model and its uploads."""
    rng = np.random.default_rng(2)
    db = TensorDB()
    for fl_round in (2, 3):
        model = {n: issue_values(2, rng, s).astype(np.float32) for n, s in SHAPES.items()}
        db.cache_tensor({TensorKey(n, uuid, fl_round, False, ("model",)): model[n] for n in model})
        trained = {}
        for col in COLS:
            tags = change_tags(("trained",), add_field=col)
            trained[col] = {n: issue_values(fl_round, rng, s).astype(np.float32)
                            for n, s in SHAPES.items()}  # fmt: skip
            db.cache_tensor({TensorKey(n, uuid, fl_round, False, tags): v
                             for n, v in trained[col].items()})  # fmt: skip
    return db, model, trained


CHOSEN = {0: list(COLS), 1: ["ucl", "1"], 2: ["2", "ucl"]}
CONFIGS = {  # (use_delta_updates, lossy STC compression), the trained tags they leave
    "plain": (False, False, ("trained",)),
    "deltas": (True, False, ("trained",)),
    "deltas+lossy": (True, True, ("lossy_decompressed", "trained")),
}


def trained_values(fl_round, rng, shape):
    """A collaborator's trained tensor: round r's values around r."""
    return rng.standard_normal(shape) + fl_round


@pytest.mark.parametrize("mode", ["paper", "sound"])
@pytest.mark.parametrize("uuid", [PLAN_UUID, "aggregator"])
def test_round_3_is_aggregated_from_round_3(tmp_path, wrap, mode, uuid):
    """The issue: OpenFL still holds round 2 when round 3 is aggregated; with negligible noise
    both modes must return a value inside round 3's inputs, [0.1, 0.3]."""
    chosen = {r: list(COLS) for r in range(4)}
    fn = Recorder(fets_dp_simagg(1e9, 1e-5, clip_norm=100.0, mode=mode, seed=3))
    aggregator, pipeline = federation(tmp_path, wrap(fn), chosen, uuid=uuid)
    run_rounds(aggregator, pipeline, chosen, issue_values)
    assert set(aggregator.tensor_db.tensor_db["round"]) >= {2, 3}
    round3 = [out for fl_round, _, _, out in fn.calls if fl_round == 3]
    assert len(round3) == len(SHAPES)
    for out in round3:
        assert np.all(out > 0.1 - 1e-4) and np.all(out < 0.3 + 1e-4), out


@pytest.mark.parametrize("mode", ["paper", "sound"])
def test_issue_table_gives_round_3(wrap, mode):
    """The issue's call: `TensorDB.get_aggregated_tensor` on round 3 with the challenge wrapper,
    eps0 = 1e9; each tensor equals the in-process aggregator on round 3's inputs."""
    db, model, trained = issue_tensor_db()
    total = sum(COLS.values())
    weights = {c: n / total for c, n in COLS.items()}
    wrapper = wrap(fets_dp_simagg(1e9, 1e-5, clip_norm=100.0, mode=mode, seed=5))
    cfg = ServerConfig("dp_simagg", mode, 1e9, 1e-5, 100.0, "l2", "analytic", 5)
    want, _ = Server(cfg).aggregate(model, [(c, trained[c], w) for c, w in weights.items()], 3)
    for name in SHAPES:
        got = db.get_aggregated_tensor(
            TensorKey(name, PLAN_UUID, 3, False, ("trained",)), weights, wrapper
        )
        assert np.all(got > 0.1 - 1e-4) and np.all(got < 0.3 + 1e-4), (name, got)
        assert np.array_equal(got, want[name])  # both modes: the simulation's server


@pytest.mark.parametrize("config", CONFIGS)
def test_openfl_writes_these_keys(tmp_path, wrap, config):
    """The keys the adapter reads, pinned against OpenFL 1.9: after two rounds the aggregator
    holds round 1 (db_store_rounds=2) with one global-model row per tensor and one trained row
    per (chosen collaborator, tensor), all under the aggregator's uuid."""
    deltas, lossy, trained_tags = CONFIGS[config]
    chosen = {0: CHOSEN[0], 1: CHOSEN[1]}
    aggregator, pipeline = federation(tmp_path, wrap(fets_dp_simagg(1.0, seed=0)), chosen,
                                      deltas=deltas, lossy=lossy)  # fmt: skip
    run_rounds(aggregator, pipeline, chosen, trained_values, deltas)
    table = aggregator.tensor_db.tensor_db
    keys = [tuple(k) for k in table[["tensor_name", "origin", "round", "report", "tags"]].values]
    assert {origin for _, origin, *_ in keys} == {PLAN_UUID}
    expected = {"ucl": ("trained", "ucl"), "1": ("1", "trained")}  # change_tags sorts
    if lossy:
        expected = {"ucl": ("lossy_decompressed", "trained", "ucl"),
                    "1": ("1", "lossy_decompressed", "trained")}  # fmt: skip
    for name in SHAPES:
        assert keys.count((name, PLAN_UUID, 1, False, ("model",))) == 1
        for col, tags in expected.items():
            assert tags == change_tags(trained_tags, add_field=col)
            assert keys.count((name, PLAN_UUID, 1, False, tags)) == 1
        assert not [k for k in keys if k[0] == name and k[2] == 1 and "2" in k[4]]  # not chosen


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("mode", ["paper", "sound"])
def test_both_modes_equal_the_in_process_aggregator(tmp_path, wrap, mode, config):
    """Three rounds, other collaborators chosen each round: every tensor equals the library's
    aggregator on the inputs OpenFL passed (local_tensors) and the round's global model, with
    the same seed; one privacy record per round."""
    deltas, lossy, _ = CONFIGS[config]
    fn = Recorder(fets_dp_simagg(1.0, 1e-5, clip_norm=2.0, mode=mode, seed=11))
    aggregator, pipeline = federation(tmp_path, wrap(fn), CHOSEN, deltas=deltas, lossy=lossy)
    models, uploads = run_rounds(aggregator, pipeline, CHOSEN, trained_values, deltas)
    assert len(fn.calls) == len(CHOSEN) * len(SHAPES)
    cfg = ServerConfig("dp_simagg", mode, 1.0, 1e-5, 2.0, "l2", "analytic", 11)
    for fl_round, cols in CHOSEN.items():
        calls = {name: (local, out) for r, name, local, out in fn.calls if r == fl_round}
        inputs = {name: {c: t for c, t, _ in local} for name, (local, _) in calls.items()}
        weights = {c: w for c, _, w in next(iter(calls.values()))[0]}
        assert list(weights) == cols
        if not lossy:  # lossless uploads arrive as sent (deltas: up to float32 rounding)
            for name, by_col in inputs.items():
                for c, t in by_col.items():
                    sent = uploads[fl_round][c][name]
                    assert np.allclose(t, sent, rtol=0, atol=1e-5 if deltas else 0)
        local = [(c, {n: inputs[n][c] for n in SHAPES}, w) for c, w in weights.items()]
        want, _ = Server(cfg).aggregate(models[fl_round], local, fl_round)  # paper mode too
        for name, (_, out) in calls.items():
            assert np.array_equal(out, want[name]), (fl_round, name)
    records = fn.func.records
    assert [r["round"] for r in records] == list(CHOSEN)
    assert all(r["mode"] == mode and r["collaborators"] == 2 for r in records[1:])
    assert [r["mechanisms"] for r in records] == [1 if mode == "sound" else len(SHAPES)] * 3


@pytest.mark.parametrize("mode", ["paper", "sound"])
def test_a_missing_collaborator_tensor_raises(tmp_path, wrap, mode):
    """'ucl' uploads round 0 without head.weight: OpenFL aggregates enc.conv.weight first, and
    the adapter refuses the round instead of aggregating it without that tensor."""
    chosen = {0: list(COLS)}
    fn = fets_dp_simagg(1.0, 1e-5, clip_norm=2.0, mode=mode, seed=0)
    aggregator, pipeline = federation(tmp_path, wrap(fn), chosen)
    rng = np.random.default_rng(0)
    trained = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    for col in ["1", "2"]:
        upload(aggregator, col, 0, trained, False, pipeline)
    with pytest.raises(ValueError, match=r"0 rows with key \('head.weight', .*'trained', 'ucl'"):
        upload(aggregator, "ucl", 0, trained, False, pipeline, drop=("head.weight",))
    assert fn.records == []
