"""Every config key is documented with its source.

- Every key path of config/schema.yaml (top level, data.<dataset>.*, each study's defaults and
  grid block keys, resources.*) appears in config/README.md as `path` in backticks. Grid block
  keys are written `seg.grid[].eps`; a block's `params` (any key of the study defaults) is one
  key, not repeated per default.
- Every hyperparameter line of the study sections (seg, fets, xcal) and of the audit block of
  config/config.yaml, i.e. a `key: value` line with a value, names its source in a trailing
  comment: "paper" (a paper section, table or figure) or "ours" (with the reason).
Each check also runs on a copy with one entry removed, to show it catches the omission.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from conftest import REPO

from dpmed.config.checks import load_schema

SCHEMA = REPO / "config" / "schema.yaml"
README = REPO / "config" / "README.md"
CONFIG = REPO / "config" / "config.yaml"
STUDIES = ("seg", "fets", "xcal", "audit")  # sections whose lines name their source

TOP_KEY = re.compile(r"^(?P<key>[A-Za-z_]\w*):")
KEY_LINE = re.compile(r"^\s+(?:- )?[A-Za-z_][\w-]*:(?P<value>[^#]*)(?:#(?P<comment>.*))?$")
SOURCE = re.compile(r"\b(?:paper|ours)\b")


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """`node` with its `$ref` chain merged in; None for an `*_override` ref (a block's
    `params`, documented as one key)."""
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name.endswith("_override"):
            return None
        node = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def schema_paths(schema: Mapping[str, Any]) -> list[str]:
    """Every key path of the schema, depth first: `data.duke.split`, `seg.grid[].eps`, ..."""
    defs = schema.get("$defs", {})
    paths: list[str] = []

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        node = _resolve(node, defs)
        if node is None:
            return
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            items = _resolve(node["items"], defs)
            if items is not None and "properties" in items:
                walk(items, prefix + "[]")
            return
        for key, sub in (node.get("properties") or {}).items():
            path = f"{prefix}.{key}" if prefix else key
            paths.append(path)
            walk(sub, path)

    walk(schema, "")
    return paths


def undocumented(paths: list[str], readme: str) -> list[str]:
    """The paths that do not appear in backticks in `readme`."""
    return [path for path in paths if f"`{path}`" not in readme]


def unsourced_lines(config_text: str) -> list[tuple[int, str]]:
    """(line number, line) of every `key: value` line in a study section without a comment
    naming "paper" or "ours". Mapping headers (no value) and continuation lines of a wrapped
    list are not hyperparameter lines."""
    missing = []
    section = None
    for number, line in enumerate(config_text.splitlines(), start=1):
        top = TOP_KEY.match(line)
        if top:
            section = top["key"]
            continue
        if section not in STUDIES:
            continue
        match = KEY_LINE.match(line)
        if match is None or not match["value"].strip():
            continue
        if not SOURCE.search(match["comment"] or ""):
            missing.append((number, line))
    return missing


def test_schema_paths_cover_every_level():
    paths = schema_paths(load_schema(SCHEMA))
    expected = (
        "device",
        "data.fets.val_fraction",
        "data.duke.synthetic.n_annotated",
        "data.dermamnist.size",
        "seg.defaults.r",
        "seg.grid[].morphs",
        "seg.grid[].params",
        "seg.grid[].sweep.lr",
        "fets.defaults.norm",
        "fets.grid[].dpmodes",
        "xcal.defaults.presets",
        "xcal.grid[].clients",
        "resources.gpu_speedup",
        "resources.xcal_train.runtime_scale",
    )
    for path in expected:
        assert path in paths
    # params refers to the defaults: documented once, not per key
    assert not any(p.startswith("seg.grid[].params.") for p in paths)
    assert len(paths) == len(set(paths))


def test_every_schema_key_is_in_the_config_readme():
    paths = schema_paths(load_schema(SCHEMA))
    assert undocumented(paths, README.read_text()) == []


def test_readme_check_catches_a_missing_key():
    paths = schema_paths(load_schema(SCHEMA))
    readme = README.read_text().replace("`seg.defaults.r`", "seg.defaults.r")
    assert undocumented(paths, readme) == ["seg.defaults.r"]


def test_every_study_hyperparameter_line_names_its_source():
    missing = unsourced_lines(CONFIG.read_text())
    assert missing == [], "lines without a 'paper' / 'ours' source comment:\n" + "\n".join(
        f"config/config.yaml:{n}: {line}" for n, line in missing
    )


def test_source_check_catches_a_missing_comment():
    lines = CONFIG.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if line.strip().startswith("r: "))
    lines[index] = lines[index].split("#")[0].rstrip()
    assert unsourced_lines("\n".join(lines)) == [(index + 1, lines[index])]


def test_source_check_reads_sections_and_lines():
    text = (
        "data:\n"
        "  duke:\n"
        "    size: [224, 224]\n"  # not a study section
        "seg:                 # paper 002\n"
        "  defaults:\n"  # a header, no value
        "    lr: 0.001          # paper 002 §4.3\n"
        "    r: 0.1             # ours: not stated\n"
        "    epochs: 50         # not stated\n"  # a comment without a source
        "  grid:\n"
        "    - datasets: [duke]\n"  # a list item without a comment
        "      morphs: [none,   # paper 002 §4.3\n"
        "               open-k3]\n"  # continuation line
    )
    assert [n for n, _ in unsourced_lines(text)] == [8, 10]
