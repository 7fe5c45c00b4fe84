"""Where this workflow's files and library come from (included first by the Snakefile, which sets
`_SOURCE`, its own folder or versioned source): `dpmed_source` / `dpmed_file` name a file of
the workflow, and the library goes first on the path (a checkout's src/) or must be installed
from the workflow's own commit (a versioned source)."""

import os
import posixpath
import runpy
import subprocess
import sys
from pathlib import Path

from snakemake.sourcecache import HostingProviderFile, LocalGitFile
from snakemake_interface_common.exceptions import WorkflowError

DPMED_ROOT = Path(_SOURCE) if isinstance(_SOURCE, os.PathLike) else None


def dpmed_source(path):
    """`path` (relative to this Snakefile) as the source file Snakemake reads. A git+file
    source gets the file's own URL: Snakemake 9 joins a path to a Snakefile at the top of a
    git repository as `/<path>`, which git cannot show."""
    if isinstance(_SOURCE, LocalGitFile):
        joined = posixpath.normpath(posixpath.join(_SOURCE.path, path))
        return LocalGitFile(_SOURCE.repo_path, joined, ref=_SOURCE.ref)
    return _SOURCE.join(path)


def dpmed_file(path):
    """A file of this workflow (`path` relative to this Snakefile) as a local path: in its
    folder, or Snakemake's source-cache copy when the Snakefile comes from a versioned source."""
    if DPMED_ROOT:
        return DPMED_ROOT / path
    return Path(workflow.sourcecache.get_path(dpmed_source(path)))


def _pip_source():
    """What `pip install` takes for the library of the git source this Snakefile comes from."""
    if isinstance(_SOURCE, LocalGitFile):
        return f"git+file://{_SOURCE.repo_path}@{_SOURCE.ref}"
    return f"git+https://{_SOURCE.host or 'github.com'}/{_SOURCE.repo}@{_SOURCE.ref}"


def _source_commit():
    """(the full hash of the commit this Snakefile is read from, the git tags on it)."""
    if isinstance(_SOURCE, LocalGitFile):
        repo = _SOURCE.repo_path
    elif isinstance(_SOURCE, HostingProviderFile):
        repo = _SOURCE.hosted_repo.repo_clone  # Snakemake's bare clone, which it reads files from
    else:
        raise WorkflowError(
            f"cannot tell which dpmed commit the workflow at {_SOURCE} is: use a checkout (its "
            "src/ runs) or a git source at a tag or commit (docs/cluster.md)"
        )
    git = ["git", "-C", str(repo)]
    commit = subprocess.run(
        [*git, "rev-parse", "--verify", f"{_SOURCE.ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tags = subprocess.run(
        [*git, "tag", "--points-at", commit], capture_output=True, text=True, check=True
    ).stdout.split()
    return commit, tags


if DPMED_ROOT and (DPMED_ROOT / "src" / "dpmed").is_dir():
    # A checkout: the library lives in src/. It goes first on sys.path here and first on
    # PYTHONPATH for every job (Snakemake only appends this process's sys.path to a `script:`
    # job's), so an installed dpmed or another checkout's editable install never runs in place
    # of this workflow's code.
    DPMED_SRC = str(DPMED_ROOT / "src")
    sys.path.insert(0, DPMED_SRC)
    os.environ.update(
        PYTHONPATH=os.pathsep.join(
            [DPMED_SRC, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
        )
    )
else:
    # A versioned source has no src/ to import: the deploying workflow installs the library at
    # the same tag or commit (docs/cluster.md), and it must hold this commit's code. The
    # comparison is this workflow's own (dpmed.install.built_from, read from its source).
    _built_from = runpy.run_path(str(dpmed_file("src/dpmed/install.py")))["built_from"]
    _COMMIT, _TAGS = _source_commit()
    try:
        import dpmed

        _FOUND = f"{dpmed.__version__} in {Path(dpmed.__file__).parent}"
    except ImportError:
        _FOUND = None
    if _FOUND is None or not _built_from(dpmed.__version__, _COMMIT, _TAGS):
        raise WorkflowError(
            f"this dpmed workflow ({_SOURCE.ref}, commit {_COMMIT[:12]}) needs the dpmed library "
            f'built from that commit (found {_FOUND or "none"}): pip install "{_pip_source()}"'
        )
