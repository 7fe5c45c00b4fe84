"""A `--configfile` replaces config/config.yaml, so a file of a few overrides lacks required
sections: it stops at load with one line naming the file and what it lacks, and one line of
hint, through Snakemake, the config checker and the job-cost table alike. Other schema errors
show the failure's own message and key path, not the schema."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG, run_snakemake
from snakemake_interface_common.exceptions import WorkflowError

from dpmed.config.checks import check_config

SCHEMA = REPO / "config" / "schema.yaml"
# A user's overrides, as they would write them: the device and one seg hyperparameter.
PARTIAL = {"device": "cpu", "seg": {"defaults": {"epochs": 3}}}
# What it lacks, by hand: the data section and seg's grid (a study it leaves out is no lack: its
# grid is empty).
PARTIAL_MISSING = {"data", "seg.grid"}
HINT = "start from a copy of config/config.yaml or config/smoke.yaml"


def missing_named(output: str) -> set[str]:
    """The keys the one 'missing required key(s)' line of `output` names."""
    (named,) = re.findall(r"missing required keys? (.*)", output)
    return set(named.split(", "))


def error_lines(output: str) -> list[str]:
    """`output` without Snakemake's profile line and the traceback frames it prints."""
    return [
        line
        for line in output.splitlines()
        if not line.startswith(("Using workflow specific profile", '  File "'))
    ]


@pytest.fixture
def partial(tmp_path):
    path = tmp_path / "partial.yaml"
    path.write_text(yaml.safe_dump(PARTIAL))
    return path


def test_a_partial_configfile_stops_the_dry_run_in_a_few_lines(partial, tmp_path):
    result = run_snakemake(
        "-n", "--configfile", str(partial), "--directory", str(tmp_path), check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert len(output.splitlines()) < 10, output
    assert missing_named(output) == PARTIAL_MISSING, output
    assert f"{partial}: missing required keys" in output
    assert HINT in output and "replaces config/config.yaml" in output
    assert "seg_train" not in result.stdout


@pytest.mark.parametrize("module", ["dpmed.config.checks", "dpmed.job_cost"])
def test_a_partial_config_file_stops_the_commands_in_two_lines(partial, module):
    cmd = [sys.executable, "-m", module, str(partial)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(f"{partial}: ") and missing_named(result.stderr) == PARTIAL_MISSING
    assert HINT in lines[1]


@pytest.mark.parametrize(
    ("config", "missing"),
    [
        (PARTIAL, PARTIAL_MISSING),
        ({"data": {}, "seg": {"grid": []}, "fets": {"defaults": {}}, "xcal": {}},
         {"seg.defaults", "fets.grid", "xcal.defaults", "xcal.grid"}),
    ],
)  # fmt: skip
def test_check_config_names_what_a_partial_config_lacks(config, missing):
    with pytest.raises(ValueError) as info:
        check_config(yaml.safe_load(yaml.safe_dump(config)), SCHEMA)
    message = str(info.value)
    assert len(message.splitlines()) == 2, message
    assert missing_named(message) == missing and HINT in message


def smoke() -> dict:
    return yaml.safe_load(SMOKE_CONFIG.read_text())


def test_a_schema_error_shows_its_message_and_key_path_only():
    config = smoke()
    config["seg"]["grid"][0]["bogus"] = 1
    with pytest.raises(WorkflowError) as info:
        check_config(config, SCHEMA)
    message = str(info.value)
    assert len(message.splitlines()) == 2 and "schema" not in message, message
    assert "'bogus' was unexpected" in message and "On instance['seg']['grid'][0]: " in message
    assert max(map(len, message.splitlines())) <= 300


def test_a_missing_key_deeper_down_names_it_and_adds_the_hint(tmp_path):
    config = smoke()
    del config["seg"]["defaults"]["lr"]
    path = tmp_path / "no_lr.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path),
                           check=False)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0 and len(output.splitlines()) < 10, output
    lines = error_lines(output)  # "WorkflowError in file ...", message, key path, hint
    assert len(lines) == 4, output
    assert lines[1].endswith("'lr' is a required property")
    assert lines[2].startswith("On instance['seg']['defaults']: {") and HINT in lines[3]


def test_a_study_section_left_out_is_an_empty_grid():
    """A config without the fets and xcal sections (and their audit cells) checks, plans no job
    of theirs and seg's jobs as the whole smoke config does."""
    full = check_config(smoke(), SCHEMA)
    config = smoke()
    del config["fets"], config["xcal"]
    audit = config["audit"]
    audit["cells"] = [cell for cell in audit["cells"] if cell["run"].startswith("results/seg/")]
    grid = check_config(config, SCHEMA)
    assert grid.jobs("fets") == grid.jobs("xcal") == [] != full.jobs("xcal")
    assert grid.jobs("seg") == full.jobs("seg") != []
