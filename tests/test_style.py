"""Code style is part of the build: ruff (lint and format) is clean on the code we ship."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

FOLDERS = ("src", "workflow", "tests", "bench")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_is_clean(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, *FOLDERS],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
