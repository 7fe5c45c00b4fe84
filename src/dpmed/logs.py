"""What every workflow job script runs inside: its prints and any traceback go to its
Snakemake log file, and its interpreter exits without a last scan of the heap."""

from __future__ import annotations

import atexit
import contextlib
import gc
import traceback
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def log_to(path: str | Path) -> Iterator[None]:
    """Redirect stdout/stderr into `path` (appending) for the block; a failure's traceback is
    written there too before it propagates, so cluster users find it in `logs/`.

    It also registers `gc.freeze` to run at interpreter exit (after the script's own exit
    handlers, which were registered later): the shutdown's garbage collection then skips the
    ~10^6 objects that importing torch and Opacus creates, about 1 s of every training job's
    wall time. Objects still in a reference cycle at exit are then never finalised; the job's
    files are closed by the time it exits, so nothing is lost."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atexit.unregister(gc.freeze)  # registered once, however many blocks a process runs
    atexit.register(gc.freeze)
    with open(path, "a", buffering=1) as handle:
        with contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
            try:
                yield
            except BaseException:
                traceback.print_exc(file=handle)
                raise
