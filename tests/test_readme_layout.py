"""The layout section of docs/extending.md names what the tree holds: every package and
top-level module of src/dpmed, every rule file, and every module a study package has."""

from __future__ import annotations

import re

from conftest import REPO

SRC = REPO / "src" / "dpmed"


def layout() -> str:
    text = (REPO / "docs" / "extending.md").read_text()
    section = text.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def named_files(block: str, folder: str) -> set[str]:
    """Names the block spells as `folder/{a,b}.ext` or `folder/name.ext`."""
    names = set()
    for braces, single in re.findall(rf"{folder}/(?:\{{([^}}]*)\}}|(\w+))\.", block):
        names.update(braces.split(",") if braces else [single])
    return names


def test_every_package_and_module_of_src_is_named():
    block = layout()
    packages = sorted(p.parent.name for p in SRC.glob("*/__init__.py"))
    assert [p for p in packages if f"{p}/" not in block] == []
    modules = sorted(p.name for p in SRC.glob("*.py") if p.name != "__init__.py")
    assert [m for m in modules if m not in block] == []


def test_every_rule_file_is_named():
    named = named_files(layout(), "rules")
    assert sorted(p.stem for p in (REPO / "rules").glob("*.smk")) == sorted(named)


def test_every_part_of_a_study_package_is_named():
    """A module of seg, fets or xcal is named as a part every study has or as its own."""
    block = layout()
    parts = {
        path.stem
        for study in ("seg", "fets", "xcal")
        for path in (SRC / study).iterdir()
        if path.suffix in (".py", ".yaml") and path.stem != "__init__" or path.is_dir()
    } - {"__pycache__"}
    assert sorted(p for p in parts if not re.search(rf"\b{p}\b", block)) == []
