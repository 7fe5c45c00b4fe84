"""Every `python -m dpmed.…` command answers `--help` with its usage and exits 0 (two of them
used to take `--help` for a config file name and raise FileNotFoundError)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def commands() -> list[str]:
    """The module name of every file under src/dpmed that runs as `python -m`: a `__main__.py`
    (its package) or a module with an `if __name__ == "__main__":` block."""
    found = []
    for path in sorted((SRC / "dpmed").rglob("*.py")):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        if path.name == "__main__.py":
            found.append(module.removesuffix(".__main__"))
        elif re.search(r'^if __name__ == "__main__":', path.read_text(), re.M):
            found.append(module)
    return found


def test_the_commands_are_found():
    assert {"dpmed.job_cost", "dpmed.config.checks", "dpmed.preflight"} <= set(commands())


@pytest.mark.parametrize("module", commands())
def test_help_prints_the_usage_and_exits_zero(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: "), result.stdout[:200]
    assert "Traceback" not in result.stderr
