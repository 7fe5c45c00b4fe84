"""Where results go in the Snakemake report (dpmed.report.outputs, rules/common.smk `reported`):
every table as an inline HTML twin of its CSV, menu entries in numeric order (checked in the
browser's collation through Node where it is installed), and the privacy summary's report item
an HTML table of its runs."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from html.parser import HTMLParser

import pandas as pd
import pytest
from conftest import SMOKE_CONFIG, loaded_workflow

from dpmed.privacy.record import PrivacyRecord
from dpmed.report.outputs import TABLE_EXTS, menu_name, report_item
from dpmed.report.privacy_summary import write_privacy_summary
from dpmed.report.style import write_table

# Every kind of label the studies use, in the order the menu must show them.
ORDERED = [
    "Fig. 1", "Fig. 2", "Figs. 3-5", "Fig. 6", "Fig. 9", "Fig. 10", "Fig. 11", "Fig. 12",
    "privacy vs utility", "sound vs paper", "Table 1", "Table 2", "Table 3", "Table 10",
    "Table II",
]  # fmt: skip


class _Cells(HTMLParser):
    """Text of every <th>/<td> of an HTML page, row by row."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def cells(page: str) -> list[list[str]]:
    parser = _Cells()
    parser.feed(page)
    return parser.rows


def test_menu_names_sort_by_number_and_read_as_the_label():
    shuffled = ORDERED[::-1]
    # casefold: the browser's collation ignores case at first; a space sorts before a digit
    # in both (the Node test below checks the collation itself)
    assert sorted(shuffled, key=lambda label: menu_name(label).casefold()) == ORDERED
    assert sorted(shuffled) != ORDERED  # plain text order puts Fig. 10 before Fig. 2
    for label in ORDERED:  # HTML collapses the padding: the menu reads as the label
        shown = " ".join(menu_name(label).split())
        assert shown == label.replace("Figs.", "Fig.")
    assert menu_name("§6 results") == "§6 results" and menu_name("Table II") == "Table II"


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node for localeCompare")
def test_menu_names_sort_by_number_in_the_browsers_collation():
    """Snakemake's report sorts subcategories with `a.localeCompare(b)`: the same call here."""
    script = (
        "const a = JSON.parse(process.argv[1]);"
        "console.log(JSON.stringify(a.sort((x, y) => x.localeCompare(y))));"
    )
    names = [menu_name(label) for label in ORDERED[::-1]]
    out = subprocess.run(
        ["node", "-e", script, json.dumps(names)], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == [menu_name(label) for label in ORDERED]


def test_the_report_shows_a_tables_html_and_a_figures_png():
    assert TABLE_EXTS == (".csv", ".md", ".html")
    assert report_item(["t.csv", "t.md", "t.html"]) == "t.html"
    assert report_item(["f.png", "f.pdf"]) == "f.png"


def test_html_twin_holds_the_tables_cells(tmp_path):
    frame = pd.DataFrame({"run": ["a<b", "c"], "eps": [0.123456, math.nan], "steps": [3, 4]})
    write_table(frame, tmp_path / "t.csv")
    page = (tmp_path / "t.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<title>t</title>" in page
    assert "a&lt;b" in page and "<style>" in page
    assert cells(page) == [["run", "eps", "steps"], ["a<b", "0.1235", "3"], ["c", "", "4"]]
    write_table(frame, tmp_path / "again.csv")
    assert (tmp_path / "again.html").read_text() == page.replace("<title>t<", "<title>again<")


class _Links(HTMLParser):
    """(href, text) of every <a> of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[list[str]] = []
        self._inside = False

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append([dict(attrs)["href"], ""])
            self._inside = True

    def handle_endtag(self, tag):
        self._inside = self._inside and tag != "a"

    def handle_data(self, data):
        if self._inside:
            self.links[-1][1] += data


def test_a_links_column_links_each_file_relative_to_the_tables_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the rules run in the working folder, paths relative to it
    frame = pd.DataFrame({
        "claim": ["a", "b"],
        "evidence": ["results/tables/x_<1>.html; results/figures/y.png", "not shown: y & z"],
    })  # fmt: skip
    write_table(frame, "results/tables/t.csv", links="evidence")
    page = (tmp_path / "results" / "tables" / "t.html").read_text()
    parser = _Links()
    parser.feed(page)
    assert parser.links == [["x_<1>.html", "x_<1>.html"], ["../figures/y.png", "y.png"]]
    assert cells(page)[2] == ["b", "not shown: y & z"]  # text stays text, escaped
    markdown = (tmp_path / "results" / "tables" / "t.md").read_text()
    assert "| a | [x_<1>.html](x_<1>.html); [y.png](../figures/y.png) |" in markdown
    csv = (tmp_path / "results" / "tables" / "t.csv").read_text()
    assert "results/tables/x_<1>.html; results/figures/y.png" in csv  # the CSV keeps the paths


def _record(eps: float) -> PrivacyRecord:
    return PrivacyRecord(
        mechanism="m", adjacency="adj", sampling="poisson", accountant="rdp", epsilon=eps,
        delta=1e-5, guarantee="dp", noise_multipliers=[1.0], epsilon_by_accountant={"rdp": eps},
        reasons=[], covers="the model",
    )  # fmt: skip


def test_privacy_summary_is_reported_as_an_html_table(tmp_path):
    """The rule's report item is the .html twin (the CSV and .md are plain outputs), and what
    the rule's script writes there is an HTML table with a row per DP run."""
    from snakemake.io import is_flagged

    with loaded_workflow(SMOKE_CONFIG, tmp_path / "wd") as workflow:
        outputs = {str(f): f for f in workflow.get_rule("privacy_summary").output}
        table_rule = workflow.get_rule("seg_rule_table").output
        shown = {
            str(f): f.flags["report"].subcategory for f in table_rule if is_flagged(f, "report")
        }
    stem = "results/tables/privacy_summary"
    assert list(outputs) == [f"{stem}{ext}" for ext in TABLE_EXTS]
    assert [name for name, f in outputs.items() if is_flagged(f, "report")] == [f"{stem}.html"]
    assert shown == {"results/tables/seg_table1_clip_rules.html": menu_name("Table 1")}

    paths = []
    for run, eps in (
        ("seg/duke/unet/flat/none/eps8/seed0", 7.9),
        ("fets/dp_simagg/sound/eps1/seed0", 2.0),
    ):
        path = tmp_path / "results" / run / "privacy.json"
        _record(eps).write(path, "duke")
        paths.append(path)
    out = tmp_path / f"{stem}.csv"
    write_privacy_summary(paths, [], out)  # what the rule privacy_summary does
    page = (tmp_path / f"{stem}.html").read_text()
    assert "<table" in page
    rows = cells(page)
    assert rows[0][:2] == ["study", "run"] and len(rows) == 3
    assert [r[rows[0].index("epsilon")] for r in rows[1:]] == ["2", "7.9"]  # fets, then seg
