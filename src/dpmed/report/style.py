"""Deterministic figure and table writers shared by every study.

Figures are saved as PNG and PDF with fixed metadata (no software version, no timestamps), so
identical inputs give byte-identical files. Tables are saved as CSV (machine-readable) plus a
Markdown twin and a standalone styled HTML twin, which the report shows inline (Snakemake's
report only links CSVs as downloads).
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dpmed.io import atomic_path, write_csv, write_text  # noqa: E402
from dpmed.report.outputs import LINK_SEPARATOR  # noqa: E402

PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


def save_figure(fig: plt.Figure, png_path: str | Path, dpi: int = 120) -> None:
    """Save `fig` to `png_path` and its `.pdf` sibling atomically, then close it. A visible
    panel that draws nothing (no line, marker, bar, image or text) is an error: a panel without
    data must say so in the panel or be dropped."""
    png_path = Path(png_path)
    empty = [ax.get_title() or f"panel {i + 1}" for i, ax in enumerate(fig.axes) if _is_empty(ax)]
    if empty:
        plt.close(fig)
        raise ValueError(f"{png_path.name}: empty panel(s) {empty}; drop them or say why")
    os.environ.setdefault("SOURCE_DATE_EPOCH", "0")
    for path, fmt, metadata in (
        (png_path, "png", PNG_METADATA),
        (png_path.with_suffix(".pdf"), "pdf", PDF_METADATA),
    ):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata, bbox_inches="tight")
    plt.close(fig)


def _is_empty(ax: plt.Axes) -> bool:
    """Whether a visible panel holds no artist that shows data or says why it has none."""
    shown = (ax.lines, ax.collections, ax.patches, ax.images, ax.texts, ax.tables)
    return ax.axison and ax.get_visible() and not any(len(artists) for artists in shown)


def label_bars(ax: plt.Axes, bars: Sequence, names: Sequence[str], errors: Sequence[float]) -> None:
    """Write each non-empty `names[i]` vertically above bar i and its error bar (`errors[i]`,
    NaN: none), a few points clear of the cap, so label and interval never overlap."""
    for bar, name, error in zip(bars, names, errors, strict=True):
        height = bar.get_height()
        if name and math.isfinite(height):
            top = height + (error if math.isfinite(error) else 0.0)
            ax.annotate(
                name, (bar.get_x() + bar.get_width() / 2, top), xytext=(0, 3),
                textcoords="offset points", ha="center", va="bottom", fontsize=6, rotation=90,
            )  # fmt: skip
    ax.margins(y=0.15)


def write_table(frame: pd.DataFrame, csv_path: str | Path, links: str | None = None) -> None:
    """Write `frame` as CSV and, next to it, as a Markdown table (`.md`) and a standalone HTML
    page (`.html`, titled with the file's stem). Column `links`, if given, holds file paths
    (relative to the working folder, `LINK_SEPARATOR` between them): the twins show each as
    a link relative to the table's folder, its text the file name."""
    csv_path = Path(csv_path)
    write_csv(csv_path, frame)
    write_text(csv_path.with_suffix(".md"), to_markdown(frame, links, csv_path.parent))
    write_text(csv_path.with_suffix(".html"), to_html(frame, csv_path.stem, links, csv_path.parent))


def _link_cell(cell: str, folder: Path, markup: str) -> str:
    """A `links` cell with each file as a link relative to `folder` (`markup` `html`: an
    escaped anchor, `md`: `[name](href)`); a cell that is not a list of paths (a file without
    a folder part) stays text (escaped in HTML)."""
    parts = cell.split(LINK_SEPARATOR) if cell else []
    if not parts or any("/" not in part for part in parts):
        return html.escape(cell, quote=False) if markup == "html" else cell
    links = []
    for part in parts:
        href, name = Path(os.path.relpath(part, folder)).as_posix(), Path(part).name
        if markup == "html":
            links.append(f'<a href="{html.escape(href)}">{html.escape(name)}</a>')
        else:
            links.append(f"[{name}]({href})")
    return LINK_SEPARATOR.join(links)


def _cell(value: object) -> str:
    """A table cell as text: floats with 4 significant digits, NaN empty."""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value)


# Inline style of the HTML tables: compact, striped, header kept in view while scrolling.
HTML_STYLE = """
body { font-family: sans-serif; font-size: 13px; margin: 8px; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #eee; position: sticky; top: 0; white-space: nowrap; }
tbody tr:nth-child(even) { background: #f7f7f7; }
"""


def to_html(
    frame: pd.DataFrame, title: str, links: str | None = None, folder: Path = Path(".")
) -> str:
    """A standalone HTML page with `frame` as a styled table (cells as in `to_markdown`,
    escaped; no index; column `links` as links relative to `folder`, see `write_table`). Only
    the frame and `title` enter it, so the bytes are deterministic."""
    cells = frame.map(lambda value: html.escape(_cell(value), quote=False))
    if links is not None:
        cells[links] = [_link_cell(_cell(v), folder, "html") for v in frame[links]]
    table = cells.to_html(index=False, escape=False, border=0, na_rep="")
    return (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{HTML_STYLE}</style>\n</head>\n"
        f"<body>\n{table}\n</body>\n</html>\n"
    )


def to_markdown(frame: pd.DataFrame, links: str | None = None, folder: Path = Path(".")) -> str:
    """A GitHub-flavoured Markdown table (floats with 4 significant digits; column `links` as
    links relative to `folder`, see `write_table`)."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = [
        "| " + " | ".join(
            _link_cell(_cell(v), folder, "md") if column == links else _cell(v)
            for column, v in zip(frame.columns, row, strict=True)
        ) + " |"
        for row in frame.itertuples(index=False)
    ]  # fmt: skip
    return "\n".join([header, rule, *rows]) + "\n"
