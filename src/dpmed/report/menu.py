"""Where a result goes in the Snakemake report: the file shown for an output and the menu name
of its subcategory.

The report's menu sorts subcategories as text (JavaScript `localeCompare`), so `Fig. 10` would
come before `Fig. 2`. `menu_name` left-pads the number after the kind (`Fig. 2`, `Table 10`)
with spaces to `NUMBER_WIDTH` digits: a space sorts before every digit (in the browser's
collation as in code-point order) and HTML collapses runs of spaces, so the menu reads as the
label and sorts by number.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

NUMBER_WIDTH = 3  # widest number in a label (paper figure / table / section numbers)
# A plural kind ("Figs. 3-5") is named in the singular so it sorts among its kind.
_SINGULAR = {"Figs.": "Fig.", "Tables": "Table"}


def menu_name(label: str) -> str:
    """The subcategory name that puts `label` in numeric order among its kind:
    `Fig. 2` → `Fig.   2`, `Figs. 3-5` → `Fig.   3-5`; a label without `<kind> <number>`
    (`§6 results`, `Table II`) is kept."""
    kind, space, rest = label.partition(" ")
    number = re.match(r"\d+", rest)
    if not number:
        return label
    padded = number.group().rjust(NUMBER_WIDTH)
    return f"{_SINGULAR.get(kind, kind)}{space}{padded}{rest[number.end() :]}"


def report_item(files: Sequence[str]) -> str:
    """The file of an output the report shows: a table's `.html` twin (shown inline, where
    the CSV would only be a download), else the first file (a figure's `.png`)."""
    html = [f for f in files if f.endswith(".html")]
    return html[0] if html else files[0]
