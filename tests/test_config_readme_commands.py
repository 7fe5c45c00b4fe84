"""The partial-rerun commands of docs/running.md (`snakemake $S ...` under "Partial reruns" and
"After a kill or a crash") work exactly as written, `S="..."` line included: each runs in a scratch
folder that links the project's workflow files. A command that would run jobs (a target,
`--until`, `-R`, `--forcerun`, `--rerun-incomplete`) gets `-n` appended; `-n`, `--unlock` and
`--list-changes` run as written. The commands run at once, in parallel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

README = REPO / "docs" / "running.md"
# What the commands read: the Snakefile, its rules, library, scripts, configs and profiles.
LINKED = ("Snakefile", "rules", "src", "workflow", "envs", "config", "profiles")
# Options with which a command runs no job, so it runs as the page writes it.
RUNS_NO_JOB = ("-n", "--unlock", "--list-changes")


def readme_commands() -> tuple[str, list[str]]:
    """(the page's `S="..."` line, every `snakemake $S ...` command without its comment)."""
    text = README.read_text()
    setting = re.search(r'^S="[^"]*".*$', text, flags=re.M)
    assert setting, "docs/running.md lost its S=... line"
    commands = [
        re.sub(r"\s+#.*$", "", line) for line in re.findall(r"^snakemake \$S.*$", text, flags=re.M)
    ]
    return setting.group(0), commands


SETTING, COMMANDS = readme_commands()


def as_run(command: str) -> str:
    """The command as the test runs it: `-n` appended unless it runs no job anyway."""
    words = command.split()
    return command if any(option in words for option in RUNS_NO_JOB) else f"{command} -n"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """command → its result, each run by bash after the page's S line."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    started = {}
    for command in COMMANDS:
        folder = tmp_path_factory.mktemp("readme")
        for name in LINKED:
            (folder / name).symlink_to(REPO / name)
        script = f"{SETTING}\n{as_run(command)}\n"
        started[command] = subprocess.Popen(
            ["bash", "-c", script], cwd=folder, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
    out = {}
    for command, process in started.items():
        output, _ = process.communicate(timeout=300)
        out[command] = subprocess.CompletedProcess(command, process.returncode, output)
    return out


def test_the_readme_lists_the_partial_rerun_commands():
    assert len(COMMANDS) >= 10 and "--configfile" in SETTING


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_rerun_command_works_as_written(results, command):
    result = results[command]
    assert result.returncode == 0, f"{as_run(command)}:\n{result.stdout[-3000:]}"
