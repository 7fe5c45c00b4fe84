"""What an installed dpmed carries of its repository: the workflow's files its commands read
(config templates, the OpenFL workspace and Flower app, the profiles, the rules), and which
commit it was built from. Standard library only: rules/source.smk runs `built_from` from the
workflow's own source, and `dpmed.slurm_profile` runs before anything is installed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

# Where setup.py's build_py puts the repository's folders in a wheel (WORKFLOW_DIRS there).
PACKAGED = Path(__file__).resolve().parent / "_workflow"
CHECKOUT = Path(__file__).resolve().parents[2]  # the repository root above src/dpmed


def workflow_file(path: str) -> Path:
    """The workflow's file or folder at `path` (relative to the repository root, e.g.
    "config/smoke.yaml"): the copy a wheel install carries in dpmed/_workflow, else the
    checkout's own (src/ on the path, an editable install)."""
    return (PACKAGED if PACKAGED.is_dir() else CHECKOUT) / path


def built_from(version: str, commit: str, tags: Iterable[str]) -> bool:
    """Whether a dpmed library of `version` (as setuptools-scm numbers a build) holds the code
    of the commit `commit` (full hash) that carries the git tags `tags`: a release X.Y.Z is the
    commit tagged vX.Y.Z (or X.Y.Z); any other build names its commit in its local part,
    X.devN+g<hash> (a modified work tree's build, X.devN+g<hash>.d<date>, is the code of no
    commit)."""
    public, _, local = version.partition("+")
    if not local:
        return not {public, f"v{public}"}.isdisjoint(tags)
    node = re.fullmatch(r"g([0-9a-f]{7,40})", local)
    return node is not None and commit.startswith(node[1])
