"""Where this workflow's files and library come from (included first by the Snakefile, which sets
`_SOURCE`, its own folder or versioned source): `dpmed_source` / `dpmed_file` name a file of
the workflow, and the library goes first on the path (a checkout's src/) or must be installed at
the workflow's own version (a versioned source)."""

import os
import posixpath
import sys
import tomllib
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
    """What `pip install` takes for the library at the version this Snakefile comes from."""
    if isinstance(_SOURCE, LocalGitFile):
        return f"git+file://{_SOURCE.repo_path}@{_SOURCE.ref}"
    if isinstance(_SOURCE, HostingProviderFile):
        return f"git+https://{_SOURCE.host or 'github.com'}/{_SOURCE.repo}@{_SOURCE.ref}"
    return f"the dpmed repository at {_SOURCE}"


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
    # the same tag (docs/cluster.md), and it must be the version this Snakefile's rules expect.
    with open(dpmed_file("pyproject.toml"), "rb") as _stream:
        _WANTED = tomllib.load(_stream)["project"]["version"]
    try:
        import dpmed

        _FOUND = f"{dpmed.__version__} in {Path(dpmed.__file__).parent}"
    except ImportError:
        _FOUND = None
    if _FOUND is None or dpmed.__version__ != _WANTED:
        raise WorkflowError(
            f"this dpmed workflow needs the dpmed library {_WANTED} of its own tag (found "
            f'{_FOUND or "none"}): pip install "{_pip_source()}"'
        )
