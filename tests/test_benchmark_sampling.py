"""`logging.benchmark_interval`: how often Snakemake samples a benchmarked job, checked on a real
Snakemake run of a job whose memory peaks briefly."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, SNAKEMAKE

from dpmed.benchmark_sampling import set_benchmark_interval

# Holds 300 MB (pages written) from 1 s to 2.5 s after it starts, then frees it and runs until
# 6 s; it imports nothing, so a loaded machine does not shift the peak towards a 5 s sample.
PEAK_JOB = (
    "import time; time.sleep(1); held = bytes(1) * (300 * 2**20); "
    "time.sleep(1.5); del held; time.sleep(3.5)"
)
SNAKEFILE = f"""
import sys
sys.path.insert(0, {str(REPO / "src")!r})
from dpmed.benchmark_sampling import set_benchmark_interval
set_benchmark_interval(config["interval"])

rule hold:
    output: "done"
    benchmark: "bench.tsv"
    shell: "{sys.executable} -c '{PEAK_JOB}' && touch {{output}}"
"""


def _peak_mb(tmp_path, interval: float) -> float:
    work = tmp_path / str(interval)
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)
    subprocess.run([*SNAKEMAKE, "--cores", "1", "--config", f"interval={interval}", "--quiet"],
                   cwd=work, check=True, capture_output=True)  # fmt: skip
    header, values = (work / "bench.tsv").read_text().splitlines()[:2]
    return float(dict(zip(header.split("\t"), values.split("\t"), strict=True))["max_rss"])


def test_the_interval_sets_how_often_snakemake_samples_a_running_job(tmp_path):
    # Snakemake's 0.5 s sees the 1.5 s peak; every 5 s samples only before and after it
    assert _peak_mb(tmp_path, 0.5) > 300
    assert _peak_mb(tmp_path, 5) < 200


@pytest.mark.parametrize("value", [0, -1, float("nan"), "5"])
def test_an_interval_that_is_not_a_positive_number_is_refused(value):
    with pytest.raises(ValueError, match="logging.benchmark_interval"):
        set_benchmark_interval(value)
