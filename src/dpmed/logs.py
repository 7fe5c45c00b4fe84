"""Send a workflow job's prints and any traceback to its Snakemake log file."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def log_to(path: str | Path) -> Iterator[None]:
    """Redirect stdout/stderr into `path` (appending) for the block; a failure's traceback is
    written there too before it propagates, so cluster users find it in `logs/`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", buffering=1) as handle:
        with contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
            try:
                yield
            except BaseException:
                traceback.print_exc(file=handle)
                raise
