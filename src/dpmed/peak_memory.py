"""Peak resident memory of this process's own program, for the jobs' and probes' records."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

STATUS = Path("/proc/self/status")


def peak_rss_bytes() -> int:
    """The high-water mark of this program's resident memory, in bytes: VmHWM of
    /proc/self/status on Linux. Not getrusage's ru_maxrss: Linux carries a parent's peak into
    its child across fork and exec, so a probe started by a 2 GB process reported at least
    2 GB whatever it used. Elsewhere ru_maxrss (bytes on macOS, KiB on other systems)."""
    if STATUS.is_file():
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
