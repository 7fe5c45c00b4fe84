"""One command line (`dpmed`): every command answers `--help`, installed as a console script;
both federation launchers draw secret noise unless given the same `--seeded`; `dpmed job-cost`
prints the grid's requested CPU-/GPU-hours and SLURM submissions, checked here by hand sums."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SMOKE_CONFIG
from snakemake.utils import update_config

from dpmed import cli, job_cost
from dpmed.config.audit import audit_jobs
from dpmed.config.checks import check_config, load_configs


def test_dpmed_help_lists_every_command_with_its_line(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--help"])
    assert stop.value.code == 0
    printed = capsys.readouterr().out
    for name, (_, line) in cli.COMMANDS.items():
        assert name in printed and " ".join(line.split()) in " ".join(printed.split())


def test_dpmed_version_is_the_installed_version(capsys):
    """`dpmed --version` names the version the module guard and the docs speak of."""
    import dpmed

    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"dpmed {dpmed.__version__}\n"


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_each_command_prints_its_own_help(command, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith("usage: ")


def test_an_unknown_or_missing_command_is_an_error_naming_the_commands(capsys):
    for argv in ([], ["bogus"]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 2
        assert capsys.readouterr().err.startswith("usage: dpmed")


def test_the_console_script_is_installed():
    """`make test` reinstalls from pyproject.toml, so the script must be there."""
    script = Path(sys.executable).parent / "dpmed"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in cli.COMMANDS)


class Parsed(Exception):
    """Raised with the launcher's parsed arguments, before it starts anything."""


@pytest.mark.parametrize("command", ["fl-openfl", "fl-flower"])
@pytest.mark.parametrize("flags, seeded", [([], False), (["--seeded"], True)])
def test_both_launchers_are_secret_unless_seeded(command, flags, seeded, monkeypatch):
    parse = argparse.ArgumentParser.parse_args

    def stop(parser, args=None, namespace=None):
        raise Parsed(parse(parser, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(Parsed) as parsed:
        cli.main([command, "--out", "unused", *flags])
    assert parsed.value.args[0].seeded is seeded


def grid(**edits):
    config = load_configs([SMOKE_CONFIG])
    update_config(config, edits)
    return config, check_config(config, REPO / "config" / "schema.yaml")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_job_cost_totals_are_the_hand_sums(device):
    config, smoke = grid(device=device)
    counts = job_cost.grid_requests(config, smoke)
    hours = sum(req.runtime * n for (_, req), n in counts.items()) / 60
    assert job_cost.grid_hours(config, counts) == (
        {"CPU": hours, "GPU": 0.0} if device == "cpu" else {"CPU": 0.0, "GPU": hours}
    )
    # seg cells 8 per submission (training + attack one component), xcal runs 4, the rest alone
    seg, xcal = len(smoke.jobs("seg")), len(smoke.jobs("xcal"))
    alone = len(smoke.jobs("fets")) + len(audit_jobs(config, smoke))
    assert seg and xcal
    assert job_cost.submissions(counts) == math.ceil(seg / 8) + math.ceil(xcal / 4) + alone
    assert sum(counts.values()) == 2 * seg + xcal + alone

    printed = job_cost.totals(config, counts)
    assert (f"{hours:,.0f} CPU-hours, 0 GPU-hours" if device == "cpu"
            else f"0 CPU-hours, {hours:,.0f} GPU-hours") in printed  # fmt: skip
    assert ("gpu_speedup" in printed) == (device == "cuda")


def test_job_cost_names_the_gpu_speedup_beside_the_gpu_hours(capsys):
    config, paper = grid_of_paper()
    counts = job_cost.grid_requests(config, paper)
    assert job_cost.main([]) == 0
    printed = capsys.readouterr().out
    gpu = sum(req.runtime * n for (_, req), n in counts.items()) / 60
    assert f"0 CPU-hours, {gpu:,.0f} GPU-hours." in printed
    speedup = config["resources"]["gpu_speedup"]
    assert f"GPU time assumes resources.gpu_speedup = {speedup:g} (an assumption, not a" in printed
    assert f"at least {job_cost.submissions(counts):,} for its {sum(counts.values()):,} jobs" in (
        printed
    )


def grid_of_paper():
    config = load_configs([])
    return config, check_config(config, REPO / "config" / "schema.yaml")
