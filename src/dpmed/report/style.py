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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.artist import Artist  # noqa: E402
from matplotlib.collections import Collection  # noqa: E402
from matplotlib.container import BarContainer, ErrorbarContainer  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator  # noqa: E402

from dpmed.io import atomic_path, write_csv, write_text  # noqa: E402
from dpmed.report.intervals import MIN_SEEDS  # noqa: E402
from dpmed.report.outputs import LINK_SEPARATOR  # noqa: E402

PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


SCALE = {"tag": ""}  # the run's scale mark on every saved figure (`set_scale`), "" for none


def set_scale(data: Mapping[str, Mapping]) -> None:
    """Mark every figure `save_figure` writes from now on with the scale of the run whose
    `data` config section is given: "synthetic data · reduced scale" where every dataset is
    synthetic (`raw: synthetic`), naming them where only some are; no mark on real data."""
    synthetic = sorted(name for name, entry in data.items() if entry.get("raw") == "synthetic")
    if synthetic and len(synthetic) == len(data):
        SCALE["tag"] = "synthetic data · reduced scale"
    elif synthetic:
        SCALE["tag"] = f"synthetic data ({', '.join(synthetic)}) · reduced scale"
    else:
        SCALE["tag"] = ""


def save_figure(fig: plt.Figure, png_path: str | Path, dpi: int = 120) -> None:
    """Save `fig` to `png_path` and its `.pdf` sibling atomically, then close it, with the
    run's scale mark (`set_scale`) in its lower right corner. A visible panel that draws
    nothing (no line, marker, bar, image or text, or only hidden, all-NaN or zero-size ones)
    is an error: a panel without data must say so in the panel or be dropped. So is a legend
    entry (of a panel with a legend, or any panel of a figure legend) that `hidden_series`
    finds drawn nowhere or fully under another series."""
    png_path = Path(png_path)
    empty = [ax.get_title() or f"panel {i + 1}" for i, ax in enumerate(fig.axes) if _is_empty(ax)]
    if empty:
        plt.close(fig)
        raise ValueError(
            f"{png_path.name}: empty panel(s) {empty} (nothing drawn, or only hidden "
            "artists); drop them or say why"
        )
    crowded = _overlapping_titles(fig)
    if crowded:
        plt.close(fig)
        raise ValueError(f"{png_path.name}: the figure title overlaps the panel title(s) {crowded}")
    legends = [ax for ax in fig.axes if fig.legends or ax.get_legend() is not None]
    hidden = [pair for ax in legends for pair in hidden_series(ax)]
    if hidden:
        plt.close(fig)
        raise ValueError(
            f"{png_path.name}: legend series drawn exactly under another (hidden, overdrawn "
            f"by): {hidden}; give them distinct markers or line styles"
        )
    if SCALE["tag"]:
        fig.text(0.995, 0.005, SCALE["tag"], ha="right", va="bottom", fontsize=7,
                 color="dimgrey", style="italic")  # fmt: skip
    os.environ.setdefault("SOURCE_DATE_EPOCH", "0")
    for path, fmt, metadata in (
        (png_path, "png", PNG_METADATA),
        (png_path.with_suffix(".pdf"), "pdf", PDF_METADATA),
    ):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata, bbox_inches="tight")
    plt.close(fig)


def _overlapping_titles(fig: plt.Figure) -> list[str]:
    """The panel titles (and seed notes) that the figure's title (`suptitle`) is drawn over."""
    title = fig._suptitle  # matplotlib keeps no public handle on it
    if title is None or not title.get_text():
        return []
    fig.draw_without_rendering()  # titles take their final place only when drawn
    renderer = fig.canvas.get_renderer()
    box = title.get_window_extent(renderer)
    texts = [t for ax in fig.axes for t in (ax.title, *ax.texts) if t.get_text()
             and (t is ax.title or t.get_gid() == "seed-note")]  # fmt: skip
    return [t.get_text() for t in texts if box.overlaps(t.get_window_extent(renderer))]


def _shows(artist: Artist) -> bool:
    """Whether `artist` puts something on the panel: visible, and a line with a finite
    point, a patch of non-zero size, a collection with an element, non-empty text, or an
    image or table."""
    if not artist.get_visible():
        return False
    if isinstance(artist, Line2D):
        xy = np.asarray(artist.get_xydata(), dtype=float).reshape(-1, 2)
        return bool(np.isfinite(xy).all(axis=1).any())
    if isinstance(artist, Rectangle):
        size = (artist.get_width(), artist.get_height())
        return all(math.isfinite(v) for v in size) and any(size)
    if isinstance(artist, Collection):
        return len(artist.get_paths()) > 0 or len(artist.get_offsets()) > 0
    if isinstance(artist, Text):
        return bool(artist.get_text().strip())
    return True


def _is_empty(ax: plt.Axes) -> bool:
    """Whether a visible panel holds no artist that shows data or says why it has none
    (`_shows`: hidden, all-NaN and zero-size artists do not count)."""
    shown = (ax.lines, ax.collections, ax.patches, ax.images, ax.texts, ax.tables)
    drawn = any(_shows(artist) for artists in shown for artist in artists)
    return ax.axison and ax.get_visible() and not drawn


def _data_line(handle: object) -> Line2D | None:
    """The line that draws a legend handle's data: the line itself, or an error bar's."""
    if isinstance(handle, Line2D):
        return handle
    if isinstance(handle, ErrorbarContainer):
        return handle.lines[0]
    return None


def _look(line: Line2D) -> tuple:
    """What tells two lines with the same points apart, apart from colour, which the line
    drawn on top covers: line style, marker, and whether markers are hollow."""
    return (line.get_linestyle(), line.get_marker(), str(line.get_markerfacecolor()) == "none")


def hidden_series(ax: plt.Axes) -> list[tuple[str, str]]:
    """(hidden, on top) labels of each legend series of `ax` in the legend but not on the
    figure: a line or bar series that draws nothing (all NaN: on top "nothing drawn"), or a
    line that draws the same points as a later one (drawn over it) with the same line style
    and marker, no wider and no larger than it: fully overdrawn."""
    handles, labels = ax.get_legend_handles_labels()
    hidden = [
        (label, "nothing drawn")
        for handle, label in zip(handles, labels, strict=True)
        if (isinstance(handle, BarContainer) and not any(_shows(p) for p in handle.patches))
        or (_data_line(handle) is not None and not _shows(_data_line(handle)))
    ]
    lines = [(label, _data_line(h)) for h, label in zip(handles, labels, strict=True)]
    lines = [(label, line) for label, line in lines if line is not None and _shows(line)]
    for i, (label, line) in enumerate(lines):
        xy = np.asarray(line.get_xydata(), dtype=float)
        for other_label, other in lines[i + 1 :]:
            if (
                np.array_equal(xy, np.asarray(other.get_xydata(), dtype=float), equal_nan=True)
                and _look(line) == _look(other)
                and other.get_linewidth() >= line.get_linewidth()
                and other.get_markersize() >= line.get_markersize()
            ):
                hidden.append((label, other_label))
                break
    return hidden


SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
SERIES_LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))


def series_look(i: int) -> dict:
    """Line style and hollow marker of the i-th series of a panel: each series looks
    different from the next ones, so one drawn on another's points stays visible."""
    return {
        "marker": SERIES_MARKERS[i % len(SERIES_MARKERS)],
        "linestyle": SERIES_LINESTYLES[i % len(SERIES_LINESTYLES)],
        "markerfacecolor": "none",
    }


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


def note_seeds(
    ax: plt.Axes, xs: Sequence[float], ys: Sequence[float], counts: Sequence[int]
) -> None:
    """State the evidence of the points (x, y) drawn from k < `MIN_SEEDS` seeds, which
    `dpmed.report.intervals.shown_interval` gives no interval: one note above the panel's upper
    right corner ("no interval: n = 1 seed per point"), kept up to date over calls for one
    panel, and "n = k" beside each point only where the panel's counts differ, so labels never
    pile up on a panel of one-seed points."""
    few = [(x, y, n) for x, y, n in zip(xs, ys, counts, strict=True)
           if n < MIN_SEEDS and math.isfinite(x) and math.isfinite(y)]  # fmt: skip
    if not few:
        return
    note = next((t for t in ax.texts if t.get_gid() == "seed-note"), None)
    seen = sorted({int(n) for *_, n in few} | set(getattr(note, "seed_counts", ())))
    words = " or ".join(map(str, seen))
    text = f"no interval: n = {words} seed{'s' * (seen != [1])} per point (< {MIN_SEEDS})"
    if note is None:  # above the frame's right end: clear of the data, legend and title
        note = ax.text(1.0, 1.01, text, transform=ax.transAxes, ha="right", va="bottom",
                       fontsize=6, color="dimgrey", gid="seed-note")  # fmt: skip
    note.set_text(text)
    note.seed_counts = seen
    if len(seen) > 1:
        for x, y, n in few:
            ax.annotate(f"n = {n}", (x, y), xytext=(3, 3), textcoords="offset points",
                        fontsize=6, color="dimgrey")  # fmt: skip


NOT_LEARNED = "did not learn"  # legend entry of a run below its study's learning floor
UNLEARNED = {"facecolor": "lightgrey", "edgecolor": "dimgrey", "hatch": "xxx"}


def _legend_once(ax: plt.Axes, label: str) -> None:
    """A zero-size grey hatched patch labelled `label` (drawn nowhere, not in the data
    limits) so the panel's legend explains the greyed bars or points, once per panel."""
    if label not in [p.get_label() for p in ax.patches]:
        ax.add_patch(Rectangle((0, 0), 0, 0, label=label, **UNLEARNED))


def grey_unlearned(ax: plt.Axes, bars: Sequence, floor: float, rule: str) -> None:
    """Grey and hatch each bar of `bars` lower than `floor` (the claims layer's learning
    floor of the metric, e.g. Dice 0.1): such a run did not learn, and its height, on an
    auto-scaled axis, would read as an effect. The legend entry reads "did not learn (`rule`)"."""
    low = [b for b in bars if math.isfinite(b.get_height()) and b.get_height() < floor]
    for bar in low:  # covered, not recoloured: the series' legend entry keeps its colour
        cover = Rectangle(bar.get_xy(), bar.get_width(), bar.get_height(), **UNLEARNED)
        ax.add_patch(cover).set_zorder(bar.get_zorder() + 0.1)
    if low:
        _legend_once(ax, f"{NOT_LEARNED} ({rule})")


def grey_unlearned_points(
    ax: plt.Axes,
    xs: Sequence[float],
    ys: Sequence[float],
    floor: float,
    rule: str,
    marker: str = "o",
    color: Any = None,
) -> None:
    """Fill grey each point (x, y) with y below `floor`, keeping its series' `marker` and
    `color` as the edge, so the series stays told apart: the run did not learn (see
    `grey_unlearned`)."""
    low = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y) and y < floor]
    if low:
        edge = UNLEARNED["edgecolor"] if color is None else color
        ax.plot(*zip(*low, strict=True), marker, ms=8, mfc=UNLEARNED["facecolor"], mec=edge,
                linestyle="none", zorder=3)  # fmt: skip
        _legend_once(ax, f"{NOT_LEARNED} ({rule})")


def grey_unlearned_cells(ax: plt.Axes, values: Sequence[Sequence[float]], floor: float,
                         rule: str) -> None:  # fmt: skip
    """Cover each cell (row i, column j) of an `imshow` grid of `values` below `floor` with a
    grey hatched square: the runs of that cell did not learn (see `grey_unlearned`)."""
    low = [(i, j) for i, row in enumerate(values) for j, v in enumerate(row)
           if math.isfinite(v) and v < floor]  # fmt: skip
    for i, j in low:
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, **UNLEARNED))
    if low:
        _legend_once(ax, f"{NOT_LEARNED} ({rule})")


def legend_handles(fig: plt.Figure) -> tuple[list, list[str]]:
    """(handles, labels) of every panel of `fig`, each label once (first panel's handle), for
    one legend of the figure: an entry only some panels need (e.g. "did not learn") is kept."""
    found: dict[str, object] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            found.setdefault(label, handle)
    return list(found.values()), list(found)


def chance_line(
    ax: plt.Axes,
    chance: float,
    label: str = "chance (1/K)",
    span: tuple[float, float] | None = None,
) -> None:
    """The score of a classifier that guesses (macro F1 or accuracy 1/K), dashed grey: across
    the panel, or from x = span[0] to span[1] (a group of bars of one dataset)."""
    style = {"color": "grey", "linestyles": (0, (4, 3)), "linewidth": 1, "label": label}
    if span is None:
        ax.axhline(chance, color="grey", linestyle=(0, (4, 3)), linewidth=1, label=label)
    else:
        ax.hlines(chance, *span, **style)


def integer_ticks(axis: matplotlib.axis.Axis) -> None:
    """Only whole-number ticks on a count axis (rounds, epochs, clients)."""
    axis.set_major_locator(MaxNLocator(integer=True))


def plain_log_ticks(axis: matplotlib.axis.Axis) -> None:
    """Log-axis ticks at 1, 2 and 5 per decade written as plain numbers (0.05, 0.5, 5, 50),
    not 5×10⁻²; no minor ticks."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(NullLocator())


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
