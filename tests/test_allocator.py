"""The jobs' allocator settings (`dpmed.allocator`): freed large blocks are reused, not
returned to the OS and faulted in again. Each case runs in a fresh interpreter, so the test
process keeps glibc's defaults."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# Allocates a 256 MiB buffer (plain malloc), writes one byte per 4 KiB page and frees it,
# twice; reports the page faults of the second round and the RSS after the last free.
PROBE = """
import json, resource, sys
from dpmed.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "kept" else False
def round_trip():
    b = bytearray(1 << 28)
    b[::4096] = b"\\x01" * (1 << 16)
    del b
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
round_trip()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
print(json.dumps({"kept": kept, "faults": faults, "rss_mb": rss / 1024}))
"""


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_memory_is_reused_instead_of_faulted_in_again():
    default, kept = _probe("default"), _probe("kept")
    pages = (1 << 28) // 4096
    assert default["faults"] > pages // 2  # glibc's default: a fresh mapping each time
    assert kept["kept"] and kept["faults"] < pages // 20
    assert kept["rss_mb"] > default["rss_mb"] + 200  # the freed 256 MiB stay in the process


def test_a_job_start_keeps_freed_memory(tmp_path, monkeypatch):
    from dpmed import runtime

    calls = []
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: calls.append(True))
    monkeypatch.setattr(runtime, "seed_everything", lambda seed, threads: None)
    job = runtime.JobContext(tmp_path, tmp_path / "run", {}, {}, seed=1, device="cpu")
    job.start()
    assert calls == [True]
