"""`dpmed.peak_memory`: a child's peak is its own, not its parent's (Linux carries ru_maxrss
across fork and exec)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from dpmed.peak_memory import peak_rss_bytes

CHILD = "from dpmed.peak_memory import peak_rss_bytes; print(peak_rss_bytes())"


def test_a_child_started_by_a_large_process_reports_its_own_peak(tmp_path):
    """A probe child (an error spec: it fails at once) started while this process holds 1 GB
    reports its own small peak; before, ru_maxrss reported at least the parent's 1 GB."""
    held = np.ones(2**27)  # 1 GiB of float64, touched
    assert peak_rss_bytes() > held.nbytes
    spec = {"probe": "seg", "study": "seg", "wildcards": {"dataset": "duke"}, "params": {},
            "seed": 0, "device": "cpu", "steps": 2, "config": {"data": {}},
            "data_dir": str(tmp_path), "work_dir": str(tmp_path)}  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", "dpmed.preflight.study", str(tmp_path / "spec.json"),
                    str(tmp_path / "result.json")], check=True, capture_output=True)  # fmt: skip
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "error"
    assert 50 < result["peak_rss_mb"] < held.nbytes / 2 / 1e6
    child = subprocess.run([sys.executable, "-c", CHILD], check=True, capture_output=True)
    assert 1e6 < int(child.stdout) < held.nbytes / 2
    del held
