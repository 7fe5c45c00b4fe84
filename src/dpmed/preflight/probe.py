"""One cell's probe, run in a child process so that its peak memory is its own:

    python -m dpmed.preflight.probe SPEC.json RESULT.json

SPEC.json: {"probe" (a probe of the study's `StudyProbe.probes`), "study", "wildcards",
"params", "seed", "device", "steps", "config" (the data section is read), "data_dir" (the
study's stand-in processed data, if it has any), "work_dir"}.
RESULT.json: the probe's measures, `status` ok or error with the message, `peak_rss_mb` (the
process's own high-water mark, `dpmed.peak_memory`) and on CUDA `peak_cuda_mb`
(torch.cuda.max_memory_allocated).

Each study's probes (`dpmed.<study>.probe`, a study's optional part) build the job as its
runner does (`<study>.run.prepare`) at the configured size and step it through the runner's own
functions `steps` times, each step timed; `seconds_per_step` is the median of the steps after
the first (the first pays for allocation and warm-up).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dpmed.io import write_text
from dpmed.peak_memory import peak_rss_bytes
from dpmed.preflight.study import study_probe


def run_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """The probe's measures with `status`, or status `error` and the message; peaks added."""
    try:
        probe = study_probe(spec["study"]).probes[spec["probe"]]
        result = {"status": "ok", **probe(spec)}
    except Exception as err:  # noqa: BLE001  (every failure of a cell is reported, not raised)
        traceback.print_exc()
        result = {"status": "error", "message": f"{type(err).__name__}: {err}"}
    result["peak_rss_mb"] = peak_rss_bytes() / 1e6
    result["device"] = "cuda" if spec["device"] != "cpu" and torch.cuda.is_available() else "cpu"
    if result["device"] == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 1e6
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the probe SPEC.json names and write RESULT.json (module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m dpmed.preflight.probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", metavar="SPEC.json", help="the probe to run")
    parser.add_argument("result", metavar="RESULT.json", help="where its result goes")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    write_text(args.result, json.dumps(run_probe(spec), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
