"""The xcal Flower app's run config: the app's defaults are the smoke config's XCal-FL cell as
the workflow resolves it, `--run-config` overrides change the job's hyperparameters and cell,
every xcal cell of the smoke grid round-trips through `dpmed flower-config`'s TOML exactly
(types included), and a bad value is refused naming its key."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from dpmed.cli import main as dpmed
from dpmed.config.checks import check_config, load_configs
from dpmed.config.grid import job_seed, wildcards_from_path
from dpmed.install import workflow_file

pytest.importorskip("flwr")
from flwr.common.config import flatten_dict, fuse_dicts, parse_config_args  # noqa: E402

from dpmed.xcal.flower import runconfig  # noqa: E402

SMOKE = workflow_file("config/smoke.yaml")
SMOKE_RUN = "results/xcal/bloodmnist/resnet18/xcal/iid/c3/eps5/seed0"


@pytest.fixture(scope="module")
def grid():
    config = load_configs([SMOKE])
    return check_config(config, workflow_file("config/schema.yaml"), [SMOKE])


def app_config() -> dict:
    """The app's run config as Flower reads it from deploy/flower/pyproject.toml."""
    pyproject = tomllib.loads((workflow_file("deploy/flower") / "pyproject.toml").read_text())
    return flatten_dict(pyproject["tool"]["flwr"]["app"]["config"])


def canonical(job) -> str:
    """A job's identity as JSON: 1 and 1.0 differ here, as they do in a plan."""
    return json.dumps([dict(job.wildcards), dict(job.params), job.seed], sort_keys=True)


def test_the_apps_default_run_config_is_the_smoke_xcal_cell(grid):
    job = runconfig.job_from_run_config(app_config())
    wildcards = wildcards_from_path("xcal", SMOKE_RUN)
    assert dict(job.wildcards) == wildcards
    assert json.dumps(dict(job.params), sort_keys=True) == json.dumps(
        grid.params("xcal", wildcards), sort_keys=True
    )
    assert job.seed == job_seed("xcal", wildcards)
    assert job.out_dir == Path("results/fl/flower") / SMOKE_RUN  # as `make fl-flower` writes it
    assert job.processed_dir == Path("results/fl/flower/data/processed")


def test_run_config_overrides_change_the_cell_and_its_hyperparameters():
    """What `flwr run . --run-config "..."` gives the ServerApp (Flower's own parse and fuse)."""
    overrides = parse_config_args(["eps='0.5' rounds=8 lr=0.1 brightness='0.5 1.5'"])
    job = runconfig.job_from_run_config(fuse_dicts(app_config(), overrides))
    assert job.wildcards["eps"] == "0.5"
    assert (job.params["rounds"], job.params["lr"], job.params["brightness"]) == (
        8,
        0.1,
        [0.5, 1.5],
    )
    assert Path(job.out_dir).name == "seed0" and Path(job.out_dir).parent.name == "eps0.5"
    assert job.seed == job_seed("xcal", {**wildcards_from_path("xcal", SMOKE_RUN), "eps": "0.5"})


@pytest.mark.parametrize(
    ("override", "named"),
    [("rounds=0", "rounds"), ("eps='five'", "eps"), ("lr=-1.0", "lr"), ("method='sgd'", "method")],
)
def test_a_bad_value_is_refused_naming_its_key(override, named):
    config = fuse_dicts(app_config(), parse_config_args([override]))
    with pytest.raises(ValueError, match=f"run config {named}"):
        runconfig.job_from_run_config(config)


def test_every_smoke_xcal_cell_round_trips_through_dpmed_flower_config(grid, tmp_path, capsys):
    """`dpmed flower-config --run <cell>` prints a TOML file Flower reads back into the very job
    the workflow runs for that cell: wildcards, hyperparameters (ints stay ints), job seed and
    the run folder <out>/<run path>."""
    data = tmp_path / "processed"
    data.mkdir()
    cells = grid.jobs("xcal")
    assert len(cells) > 5
    for cell in cells:
        run = runconfig.run_path(cell.wc)
        dpmed(["flower-config", "--run", str(run), "--processed", str(data), "--out", "out"])
        config = parse_config_args([_write(tmp_path / "run.toml", capsys.readouterr().out)])
        job = runconfig.job_from_run_config(fuse_dicts(app_config(), config))
        expected = json.dumps(
            [dict(cell.wc), grid.params("xcal", cell.wc), job_seed("xcal", cell.wc)],
            sort_keys=True,
        )
        assert canonical(job) == expected, run
        assert job.out_dir == Path("out").resolve() / run
        assert job.processed_dir == data.resolve()


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_job_whose_seed_is_not_its_cells_has_no_run_config():
    """The run config derives the job seed from the cell, as the workflow does: a job carrying
    another seed would run as a different job, so it is refused."""
    job = runconfig.job_from_run_config(app_config())
    with pytest.raises(ValueError, match="job seed"):
        runconfig.run_config(replace(job, seed=job.seed + 1))
