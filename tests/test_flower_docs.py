"""docs/deploy.md's Flower section runs what `make fl-flower` runs, into the same folder, and
every dpmed command it shows parses as written."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest
from conftest import REPO

from dpmed import cli

DOC = (REPO / "docs" / "deploy.md").read_text()
FLOWER = DOC[DOC.index("## XCal-FL in Flower") :]


def shown_commands(text: str) -> list[str]:
    """The `dpmed ...` commands of the indented code blocks, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [ln.strip() for ln in joined.splitlines() if re.match(r" {4,}dpmed ", ln)]


def test_the_docs_run_the_makefiles_fl_flower_command():
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^fl-flower:.*\n\t(.+)$", makefile, re.M).group(1)
    assert recipe.startswith("$(BIN)/dpmed fl-flower --out ")
    assert recipe.removeprefix("$(BIN)/") in shown_commands(FLOWER)
    out = recipe.split("--out ")[1]
    for command in shown_commands(FLOWER):  # every launcher command shown writes there too
        if command.startswith("dpmed fl-flower"):
            assert command.endswith(f"--out {out}"), command


class Parsed(Exception):
    """Raised with a command's parsed arguments, before it does anything."""


@pytest.mark.parametrize("command", shown_commands(FLOWER))
def test_each_dpmed_command_shown_parses(command, monkeypatch):
    parse = argparse.ArgumentParser.parse_args

    def stop(parser, args=None, namespace=None):
        raise Parsed(parse(parser, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(Parsed):
        cli.main(shlex.split(command)[1:])
