"""The package's import graph: no import circle, no layer shared by the studies reaches into a
study package (a study is its package and one line in dpmed.studies), and the privacy package
sits below the config and the study registry.

Every import counts, the ones inside functions too: a function-level import that closes a
circle still ties the two modules together, it only hides the tie from the interpreter.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
STUDY_PACKAGES = ("dpmed.seg", "dpmed.fets", "dpmed.xcal")
# The composition root: the one module that names every study.
REGISTRY = "dpmed.studies"


def module_files() -> dict[str, Path]:
    """Dotted module name → file, for every module under src/dpmed."""
    files = {}
    for path in sorted((SRC / "dpmed").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The dpmed modules `path` imports anywhere in its body (module or function level); a
    `from package import name` counts as an import of the submodule `name` when there is one."""

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(m for m in map(owner, names) if m is not None)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(path, modules) - {name} for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def in_study(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in STUDY_PACKAGES)


def test_the_circle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_no_shared_layer_imports_a_study_package():
    """Only a study's own modules and the registry name a study package."""
    offenders = {
        module: sorted(filter(in_study, imports))
        for module, imports in import_graph().items()
        if not in_study(module) and module != REGISTRY and any(map(in_study, imports))
    }
    assert offenders == {}


@pytest.mark.parametrize("study", STUDY_PACKAGES)
def test_a_study_imports_no_other_study(study):
    offenders = {
        module: sorted(i for i in imports if in_study(i) and not i.startswith(study))
        for module, imports in import_graph().items()
        if module.startswith(study + ".") or module == study
    }
    assert {m: i for m, i in offenders.items() if i} == {}


def test_privacy_imports_neither_the_config_nor_the_studies():
    """The mechanisms, accounting and audit bounds of `dpmed.privacy` know no config or study
    registry (the audit runner that needs both is `dpmed.audit`)."""
    above = ("dpmed.config", "dpmed.studies")
    offenders = {
        module: sorted(i for i in imports if i.startswith(above))
        for module, imports in import_graph().items()
        if module.startswith("dpmed.privacy")
    }
    assert {m: i for m, i in offenders.items() if i} == {}
