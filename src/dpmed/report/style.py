"""Deterministic figure and table writers shared by every study.

Figures are saved as PNG and PDF with fixed metadata (no software version, no timestamps), so
identical inputs give byte-identical files. Tables are saved as CSV plus a Markdown twin.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dpmed.io import atomic_path, write_csv, write_text  # noqa: E402

PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


def save_figure(fig: plt.Figure, png_path: str | Path, dpi: int = 120) -> None:
    """Save `fig` to `png_path` and its `.pdf` sibling atomically, then close it."""
    png_path = Path(png_path)
    os.environ.setdefault("SOURCE_DATE_EPOCH", "0")
    for path, fmt, metadata in (
        (png_path, "png", PNG_METADATA),
        (png_path.with_suffix(".pdf"), "pdf", PDF_METADATA),
    ):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata, bbox_inches="tight")
    plt.close(fig)


def write_table(frame: pd.DataFrame, csv_path: str | Path) -> None:
    """Write `frame` as CSV and as a Markdown table next to it (`.md`)."""
    csv_path = Path(csv_path)
    write_csv(csv_path, frame)
    write_text(csv_path.with_suffix(".md"), to_markdown(frame))


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (floats with 4 significant digits)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:.4g}"
        return str(value)

    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"
