"""xcal registries (methods, shifts) and spec: the schema and the wildcard patterns read them,
the grid's validity rules and the report's order follow them, and a toy method or shift
registered in one place runs through the real runner."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from conftest import SMOKE_CONFIG, XCAL_PARAMS, xcal_processed

from dpmed.config.checks import check_config, load_configs
from dpmed.config.study import StudySpec
from dpmed.privacy.accounting import noise_multiplier
from dpmed.runtime import JobContext
from dpmed.xcal import grid as spec
from dpmed.xcal import outputs
from dpmed.xcal.federation import build_federation
from dpmed.xcal.methods import (
    METHODS,
    Method,
    method_rank,
    method_regex,
    resolve,
    split_method,
)
from dpmed.xcal.run import run
from dpmed.xcal.shifts import SHIFTS
from dpmed.xcal.spec import SPEC

REPO = Path(__file__).resolve().parents[1]
PARAMS = {**XCAL_PARAMS, "rounds": 1, "road_subsample": 4, "road_percentages": [0.5]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return xcal_processed(tmp_path_factory.mktemp("xcal_tiny"), [60, 10, 12])


def _job(
    processed: Path, out: Path, method: str, eps: str, shift: str = "iid", clients: str = "2"
) -> JobContext:
    wc = {
        "dataset": "bloodmnist",
        "model": "resnet18",
        "method": method,
        "shift": shift,
        "clients": clients,
        "eps": eps,
        "seed": "0",
    }
    return JobContext(processed, out, wc, PARAMS, seed=0, device="cpu", threads=1)


# ------------------------------------------------------------------ schema and spec


def test_method_pattern_takes_a_preset_only_where_the_method_does():
    pattern = SPEC.patterns["method"]
    for method in ("nondp", "centralized", "static", "agp", "agp-dp", "xcal", "xcal-logit"):
        assert re_full(pattern, method), method
    for method in ("static-logit", "xcal-", "xcalx", "dp", "agp-x", "agp-dp-x"):
        assert not re_full(pattern, method), method


def re_full(pattern: str, text: str) -> bool:
    return re.fullmatch(f"(?:{pattern})", text) is not None


def _old_invalid(wc: dict[str, str]) -> str | None:
    """The validity rules as hand-written before the method registry."""
    private = wc["eps"] != "inf"
    method = wc["method"]
    if method == "nondp" and private:
        return "nondp needs eps inf"
    if method not in ("nondp", "centralized") and not private:
        return f"{method} is a DP method and needs a finite eps"
    if (method == "centralized") != (wc["clients"] == "1"):
        return "centralized runs have clients 1, federated runs at least 2"
    if method == "centralized" and wc["shift"] != "iid":
        return "centralized runs pool the data: shift iid only"
    return None


def test_validity_rules_read_from_the_registry_keep_their_verdicts_and_reasons():
    methods = ["nondp", "centralized", "static", "agp", "agp-dp", "xcal", "xcal-logit"]
    for method, shift, clients, eps in itertools.product(
        methods, SHIFTS.names(), ["1", "3"], ["inf", "5"]
    ):
        wc = {"method": method, "shift": shift, "clients": clients, "eps": eps}
        assert spec.invalid(wc) == _old_invalid(wc), wc


def test_targets_list_run_files_with_model_pt_then_tables_and_figures():
    grid = check_config(load_configs([SMOKE_CONFIG]), REPO / "config" / "schema.yaml")
    job = next(iter(grid.jobs("xcal")))
    assert outputs.targets([]) == []
    targets = outputs.targets([job])
    assert targets[: len(outputs.RUN_FILES)] == [f"{job.path}/{f}" for f in outputs.RUN_FILES]
    assert f"{job.path}/model.pt" in targets
    assert "results/measured/xcal_runtime.csv" in targets
    assert {f"results/figures/{n}.png" for n in outputs.FIGURES} <= set(targets)
    assert set(outputs.REPORT_GROUPS) == {
        *outputs.TABLES,
        *outputs.MEASURED_TABLES,
        *outputs.FIGURES,
    }
    assert isinstance(SPEC, StudySpec)
    assert SPEC.log("xcal_train") == (
        "logs/xcal_train/{dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}/seed{seed}.log"
    )


def test_method_names_presets_and_report_order():
    registered = ("nondp", "centralized", "static", "agp", "agp-dp", "xcal", "xcal-paper",
                  "xcal-random")  # fmt: skip
    assert METHODS.names() == registered
    assert split_method("xcal") == ("xcal", "balanced")
    assert split_method("xcal-random") == ("xcal-random", None)  # not xcal + preset random
    assert split_method("xcal-logit") == ("xcal", "logit")
    assert split_method("agp") == ("agp", None)
    assert split_method("agp-dp") == ("agp-dp", None)  # a registered name, not agp + preset
    assert split_method("xcal-margin")[1] == "margin" and split_method("static")[1] is None
    assert split_method("agp-dp")[1] is None
    with pytest.raises(ValueError, match="takes no preset"):
        split_method("static-logit")
    with pytest.raises(ValueError, match="takes no preset"):
        split_method("agp-x")
    with pytest.raises(ValueError, match="unknown xcal method 'sgd'.*nondp, centralized"):
        split_method("sgd")
    order = ["xcal-logit", "xcal-random", "agp-dp", "static", "nondp", "xcal", "xcal-amplified"]
    # registration order, then the presets of a method after its bare name
    ranked = [*registered[:6], "xcal-amplified", "xcal-logit", "xcal-random"]
    # a registered name with presets: the longest registered name the wildcard starts with
    assert split_method("xcal-paper") == ("xcal-paper", "balanced")
    assert split_method("xcal-paper-logit") == ("xcal-paper", "logit")
    assert method_rank("xcal-paper-logit") == (6, "logit")
    assert sorted([*order, "agp", "centralized"], key=method_rank) == ranked
    assert method_rank("agp-dp") == (4, "")


def test_resolve_picks_the_training_entry():
    presets = PARAMS["presets"]
    assert resolve("centralized", False, presets) is METHODS["nondp"]
    assert resolve("centralized", True, presets) is METHODS["centralized"]
    assert resolve("xcal-logit", True, presets).weights == (1.0, 0.0, 0.0)
    assert resolve("xcal", True, presets).weights == (1.0, 1.0, 1.0)
    assert resolve("agp-dp", True, presets) is METHODS["agp-dp"]
    assert resolve("agp", True, presets).paper_flaw and METHODS["agp-dp"].paper_flaw is None
    with pytest.raises(ValueError, match="needs a finite eps"):
        resolve("static", False, presets)
    with pytest.raises(ValueError, match="needs eps inf"):
        resolve("nondp", True, presets)


# ------------------------------------------------------------------ toy entries, end to end


@dataclass(frozen=True)
class DoubleNoise(Method):
    """Toy: DP-SGD at twice the σ that meets the target."""

    mechanism: ClassVar[str] = "toy: DP-SGD at twice the calibrated sigma"

    def calibrate(self, client, epsilon):
        state = super().calibrate(client, epsilon)
        state.sigma_ref *= 2
        return state


@pytest.fixture
def toy_method():
    METHODS.add("double", DoubleNoise())
    try:
        yield "double"
    finally:
        METHODS.remove("double")


def test_a_registered_toy_method_runs_through_the_real_runner(tiny, tmp_path, toy_method):
    assert "double" in method_regex() and method_rank("double")[0] == len(METHODS) - 1
    assert spec.invalid({"method": "double", "shift": "iid", "clients": "2", "eps": "inf"})
    metrics = run(_job(tiny, tmp_path, "double", "2"))
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert privacy["mechanism"] == DoubleNoise.mechanism and privacy["guarantee"] == "dp"
    sizes = metrics["client_sizes"]
    steps = [math.ceil(n / PARAMS["batch_size"]) for n in sizes]
    expected = sorted({2 * noise_multiplier(2.0, 1e-5, 1 / s, s) for s in steps})
    assert privacy["noise_multipliers"] == pytest.approx(expected)
    assert 0 < privacy["epsilon"] < 2.0  # twice the noise spends less than the target
    assert (tmp_path / "model.pt").exists()


def test_a_removed_toy_method_is_unknown_again(toy_method):
    METHODS.remove(toy_method)
    try:
        with pytest.raises(ValueError, match="unknown xcal method 'double'"):
            split_method("double")
    finally:
        METHODS.add(toy_method, DoubleNoise())  # the fixture removes it


def test_a_registered_toy_shift_runs_through_the_real_runner(tiny, tmp_path):
    @SHIFTS.register("first10")
    def first10(images, labels, n_clients, params, seed):
        """Toy: the first 10 images to client 0, the rest to client 1."""
        return [(images[:10], labels[:10]), (images[10:], labels[10:])]

    try:
        assert "first10" in SHIFTS.pattern()
        metrics = run(_job(tiny, tmp_path, "nondp", "inf", shift="first10"))
    finally:
        SHIFTS.remove("first10")
    assert metrics["shift"] == "first10" and metrics["client_sizes"] == [10, 50]
    assert "first10" not in SHIFTS


# ------------------------------------------------------------------ per-client state

# What a client is, whatever its method: data, generators, the audit hook and its account
# (plan, counters and the method's own state).
CLIENT_ATTRIBUTES = {
    "x", "y", "cam_layer", "sampler", "signal_sampler", "noise", "audit", "account",
}  # fmt: skip


def _attributes(obj: object) -> set[str]:
    """The attributes set on `obj` itself: its `__dict__` and its filled slots."""
    slots = {name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())}
    return set(getattr(obj, "__dict__", {})) | {name for name in slots if hasattr(obj, name)}


@pytest.mark.parametrize(
    ("method", "eps", "clients"),
    [("nondp", "inf", "2"), ("centralized", "2", "1"), ("static", "2", "2"), ("agp", "2", "2"),
     ("agp-dp", "2", "2"), ("xcal", "2", "2"), ("xcal-random", "2", "2")],
)  # fmt: skip
def test_a_method_keeps_its_client_state_in_its_own_declared_type(
    tiny, tmp_path, method, eps, clients
):
    """Training and a checkpoint round trip set nothing on a client beyond what every client
    has; the method's state holds exactly the fields its type declares (none when
    non-private) and takes no other."""
    fed = build_federation(_job(tiny, tmp_path, method, eps, clients=clients), torch.device("cpu"))
    global_state = {k: v.detach().clone() for k, v in fed.net.state_dict().items()}
    for client in fed.clients:
        client.train_round(fed.net, fed.wrapped, global_state)
        client.load_state(client.state())
        client.train_round(fed.net, fed.wrapped, global_state)
        assert _attributes(client) == CLIENT_ATTRIBUTES
        account = client.account
        assert _attributes(account) == {f.name for f in dataclasses.fields(account)}
        state = account.state
        if not fed.method.dp:
            assert state is None
            continue
        assert dataclasses.is_dataclass(state)
        assert _attributes(state) == {f.name for f in dataclasses.fields(state)}
        with pytest.raises(AttributeError):
            state.undeclared = 0.0
        assert fed.method.reference_sigma(account) == state.sigma_ref > 0
