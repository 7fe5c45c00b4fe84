"""Code style is part of the build: ruff (lint and format) is clean on the code we ship."""

from __future__ import annotations

import re
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


# The project explains its privacy findings in its own docs (docs/privacy.md) and never points
# users at material outside the repository: no section of an upper-case note file (`NOTES §2`),
# no numbered design principle, no path into a sibling `shared/` folder.
OUTSIDE_CITATIONS = re.compile(r"\b[A-Z]{4,}(\.md)? ?§|\bprinciple \d|\.\./shared|\bshared/")
SHIPPED = ("src", "workflow", "rules", "config", "docs", "bench", "README.md", "Snakefile")


def test_no_file_cites_material_outside_the_repository():
    offenders = []
    for entry in SHIPPED:
        root = REPO / entry
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if path.suffix in {".pyc", ".png", ".pdf", ".npz"} or "__pycache__" in path.parts:
                continue  # binaries and build caches
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if OUTSIDE_CITATIONS.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_privacy_findings_cited_in_code_exist_in_the_docs():
    doc = (REPO / "docs" / "privacy.md").read_text()
    findings = {int(n) for n in re.findall(r"^(\d+)\. \*\*", doc, flags=re.MULTILINE)}
    cited = set()
    for path in (REPO / "src").rglob("*.py"):
        for group in re.findall(r"docs/privacy\.md, findings? ([\d\-–, ]+)", path.read_text()):
            cited |= {int(n) for n in re.findall(r"\d+", group)}
    assert cited, "no code cites docs/privacy.md"
    assert cited <= findings, sorted(cited - findings)
