"""Shared fixtures: repository paths and one run of the whole smoke DAG reused by every
workflow test (the suite pays for the smoke grid once, on one xdist worker)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SMOKE_CONFIG = REPO / "config" / "smoke.yaml"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
DATA_STAGE_TARGETS = ["datasets_table", "data_overview", "fets_figure1"]
# The rules that train or attack one cell, each sized by the job-cost model.
TRAINING_RULES = ("seg_train", "seg_attack", "fets_train", "xcal_train")
# Hyperparameters of the tiny seg runs the unit tests train (tests override a few).
SEG_PARAMS = dict(
    epochs=2,
    batch_size=8,
    lr=0.003,
    optimizer="adam",
    clip_norm=1.0,
    delta=1e-5,
    accountant="rdp",
    grad_sample_mode="auto",
    autos_gamma=0.01,
    r=0.1,
    quantiles=[20, 85],
    attack_calibration=0.5,
    width=8,
    depth=3,
    deep_supervision=True,
    dice_weight=1.0,
)


# Tiny xcal hyperparameters (1 round over 28² BloodMNIST, width 1/8) shared by the xcal tests.
XCAL_PARAMS = {
    "rounds": 2,
    "local_epochs": 1,
    "batch_size": 16,
    "lr": 0.01,
    "momentum": 0.9,
    "clip_norm": 1.0,
    "delta": 1e-5,
    "signal_fraction": 0.1,
    "band": 0.2,
    "top_q": 0.2,
    "ema": 0.9,
    "presets": {"balanced": [1, 1, 1], "logit": [1, 0, 0]},
    "dirichlet_alpha": 0.5,
    "brightness": [0.6, 1.4],
    "road_subsample": 6,
    "road_every": 1,
    "road_percentages": [0.3, 0.7],
    "width_scale": 0.125,
    "clients_per_round": 10,
}
# The deployed-federation (Flower) tests' cell: XCal-FL, 3 clients, eps 2, 2 rounds of 2.
FLOWER_WILDCARDS = {"dataset": "bloodmnist", "model": "resnet18", "method": "xcal",
                    "shift": "iid", "clients": "3", "eps": "2", "seed": "0"}  # fmt: skip
FLOWER_PARAMS = {**XCAL_PARAMS, "rounds": 2, "clients_per_round": 2, "road_subsample": 4}


@contextlib.contextmanager
def loaded_workflow(configfile: Path, workdir: Path) -> Iterator[Any]:
    """The Snakemake `Workflow` the Snakefile builds with `configfile` (rules parsed, no DAG),
    through Snakemake's API in this process, so in-process registry changes are seen."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        OutputSettings,
        ResourceSettings,
        StorageSettings,
    )

    with SnakemakeApi(OutputSettings(quiet=None)) as api:
        yield api.workflow(
            resource_settings=ResourceSettings(),
            config_settings=ConfigSettings(configfiles=[configfile]),
            storage_settings=StorageSettings(),
            snakefile=REPO / "Snakefile",
            workdir=workdir,
        )._workflow


def run_snakemake(*args: str, cwd: Path = REPO, check: bool = True) -> subprocess.CompletedProcess:
    """Run Snakemake on the repository's Snakefile; output captured as text."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), *args]
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def site_slurm_profile(root: Path) -> Path:
    """profiles/slurm-template installed below `root` as `make slurm-profile` would, with the
    partitions `cpu` and `gpu` and account `proj`; the folder to pass to `--profile`."""
    from dpmed.slurm_profile import install

    dest = root / "slurm"
    values = {"<account>": "proj", "<cpu-partition>": "cpu", "<gpu-partition>": "gpu"}
    install(REPO / "profiles" / "slurm-template", dest, values)
    return dest


def unit_duke_config() -> dict:
    """data.duke of config/smoke.yaml with 10 subjects split 60/20/20 (18 training, 6 val and
    6 test images) instead of the demo's 134 split for the attack: in-process unit tests train
    on it in seconds."""
    cfg = yaml.safe_load(SMOKE_CONFIG.read_text())["data"]["duke"]
    cfg["synthetic"] = cfg["synthetic"] | {"n_subjects": 10}
    cfg["split"] = [0.6, 0.2, 0.2]
    return cfg


@pytest.fixture(scope="session")
def duke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Processed synthetic Duke of `unit_duke_config`, shared by the in-process seg tests."""
    from dpmed.data.stage import preprocess, synthesize

    cfg = unit_duke_config()
    root = tmp_path_factory.mktemp("unit_duke")
    synthesize("duke", cfg, root / "raw")
    preprocess("duke", cfg, root / "raw", root / "processed")
    return root / "processed"


def run_data_stage(workdir: Path) -> None:
    """Run the data stage of the smoke config in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    run_snakemake(
        "--directory", str(workdir), "--configfile", str(SMOKE_CONFIG), "--cores", "2",
        *DATA_STAGE_TARGETS,
    )  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs the suite on two pytest-xdist workers (`--dist loadgroup
    --no-loadscope-reorder`): every test of the smoke run goes to one worker, so the smoke DAG
    still runs once, and the other tests of a file to one worker, so a module's fixtures are
    built once.

    Groups are handed out in the order left here, two to a worker at the start. The smoke group
    goes first, so its long DAG starts at once; files with slow tests go next, so the other
    worker starts on them; the group queued behind the smoke DAG is a light one, as the worker
    that runs the smoke DAG is busy for most of the suite."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        smoke = "smoke_run" in getattr(item, "fixturenames", ())
        group = "smoke_run" if smoke else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    order = sorted(groups, key=lambda name: (
        name != "smoke_run", not any(item.get_closest_marker("slow") for item in groups[name])
    ))  # fmt: skip
    if len(order) > 3:
        order.insert(2, order.pop())
    items[:] = [item for name in order for item in groups[name]]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory where the whole smoke DAG (`rule all` of config/smoke.yaml: data
    stage, every study run, table and figure) has run once."""
    workdir = tmp_path_factory.mktemp("smoke")
    start = time.perf_counter()
    run_snakemake("--directory", str(workdir), "--configfile", str(SMOKE_CONFIG), "--cores", "2")
    print(f"smoke DAG: {time.perf_counter() - start:.0f} s")
    return workdir


def noise_free_dp_step(net, x, y, rule, mode: str):
    """One DP-SGD step of `net` on the whole batch (q = 1) without noise and with lr 0, through
    the real Opacus integration; returns the DP optimizer (gradients left in `net`)."""
    from torch.optim import SGD
    from torch.utils.data import TensorDataset

    from dpmed.privacy.dpsgd import ScaledPrivacyEngine
    from dpmed.seg.losses import per_sample_loss

    dp = ScaledPrivacyEngine(rule).make_private_poisson(
        net,
        SGD(net.parameters(), lr=0.0),
        TensorDataset(x, y),
        sample_rate=1.0,
        noise_multiplier=0.0,
        grad_sample_mode=mode,
    )
    dp.optimizer.zero_grad()
    dp.backward(per_sample_loss(dp.module(x), y))
    dp.optimizer.step()
    return dp.optimizer


class Killed(BaseException):
    """Stands for kill -9 at a phase boundary of a training job (a BaseException, so no
    `except Exception` in the runner can swallow it)."""


def save_then_die(patch: pytest.MonkeyPatch, unit: str, at: int | None = None) -> None:
    """`Checkpoint.save` kills the job right after saving the state whose `unit` (epoch or
    round) is `at` (None: the first save)."""
    from dpmed.checkpoint import Checkpoint

    original = Checkpoint.save

    def dies_after_saving(self, state):
        original(self, state)
        if at is None or state[unit] == at:
            raise Killed(f"after {unit} {state[unit]}")

    patch.setattr(Checkpoint, "save", dies_after_saving)


def die_on_first_call(patch: pytest.MonkeyPatch, module: Any, name: str) -> None:
    """`module.<name>` kills the job when first called."""

    def dies(*args, **kwargs):
        raise Killed(name)

    patch.setattr(module, name, dies)


def phase_kills(module: Any, unit: str, at: int, first_output_step: str) -> dict[str, Any]:
    """The phase boundaries of a training job, each as a patcher: after the checkpoint of
    `unit` `at`, after the last checkpoint but before any output (`module.<first_output_step>`
    is called first), and between two output files (model.pt is written after others)."""
    return {
        f"after {unit} {at}": lambda patch: save_then_die(patch, unit, at),
        "before the outputs": lambda patch: die_on_first_call(patch, module, first_output_step),
        "between outputs": lambda patch: die_on_first_call(patch, module, "save_model"),
    }


def xcal_processed(root: Path, counts: list[int], seed: int = 0) -> Path:
    """Synthetic bloodmnist at 28 px with `counts` (train, val, test) images, processed."""
    from dpmed.data.stage import preprocess, synthesize

    cfg = {"raw": "synthetic", "size": 28, "synthetic": {"counts": counts, "seed": seed}}
    synthesize("bloodmnist", cfg, root / "raw")
    preprocess("bloodmnist", cfg, root / "raw", root / "processed")
    return root / "processed"
