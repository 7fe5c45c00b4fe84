"""The toy study's table: one row per run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from dpmed.report.style import write_table


def write_toy_table(metrics: list[str], csv_path: str) -> None:
    """mse and σ of every run."""
    rows = [{"run": str(Path(p).parent), **json.loads(Path(p).read_text())} for p in metrics]
    write_table(pd.DataFrame(rows), csv_path)
