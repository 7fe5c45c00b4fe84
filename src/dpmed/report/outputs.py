"""Tables and figures as registry entries: a study registers each of its table/figure rules
once (`ReportOutput`: writer, files and captions, inputs, params, when the grid asks for it);
`rules/report.smk` generates one Snakemake rule per entry and `rule all` asks for the targets
the entry yields for the grid. A new paper table or figure is then three things: its writer
function, its entry, and its caption in the study package's `captions/`.

The generated rule calls `workflow/scripts/report_output.py`, which imports the writer
("module:function") and calls it with the rule's named inputs (lists of paths; names starting
with `_` are dependencies only), its named outputs (the first file of each: the `.png` of a
figure, the `.csv` of a table — the writer adds the `.pdf` / the `.md` and `.html`) and its
params. The report shows a figure's `.png` and a table's `.html` (`report_item`).
`summary_inputs` lists the run files of the rule `demo_summary` (`dpmed.report.demo_summary`);
this module imports neither pandas nor matplotlib: the Snakemake process reads it.

The report's menu sorts subcategories as text (JavaScript `localeCompare`), so `Fig. 10` would
come before `Fig. 2`. `menu_name` left-pads the number after the kind (`Fig. 2`, `Table 10`)
with spaces to `NUMBER_WIDTH` digits: a space sorts before every digit (in the browser's
collation as in code-point order) and HTML collapses runs of spaces, so the menu reads as the
label and sorts by number.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FIGURE_EXTS = (".png", ".pdf")
TABLE_EXTS = (".csv", ".md", ".html")
# Between the file paths of a table cell that lists files (`dpmed.report.style.write_table`'s
# `links`): the .md and .html twins show each as a link.
LINK_SEPARATOR = "; "
# The writer keyword of an output says what it is.
EXTS_OF_KEYWORD = {"png_path": FIGURE_EXTS, "csv_path": TABLE_EXTS}
NUMBER_WIDTH = 3  # widest number in a menu label (paper figure / table / section numbers)
# A plural kind ("Figs. 3-5") is named in the singular so it sorts among its kind.
_SINGULAR = {"Figs.": "Fig.", "Tables": "Table"}


def once_if_jobs(jobs: Sequence[Any]) -> list[dict[str, str]]:
    """The default `wanted`: the output once when the study has any job."""
    return [{}] if jobs else []


@dataclass(frozen=True)
class ReportOutput:
    """One table/figure rule of a study.

    Args:
        writer: "module:function" that writes the files.
        files: writer keyword (`png_path` or `csv_path`) → (path stem without extension, caption
            name in the study's captions/); stems may hold wildcards (`{dataset}`).
        subcategory: the paper's figure/table number, the report's menu entry (sorted by
            number, `menu_name`).
        inputs: named inputs for the study's jobs: lists of paths, or functions of the
            wildcards (names starting with `_`: dependencies the writer does not take).
        params: extra writer arguments for the study's jobs and the config.
        wanted: the wildcard values of every output `rule all` asks for ([{}] once, [] never).
        constraints: wildcard → regex for the stems' wildcards.
    """

    writer: str
    files: Mapping[str, tuple[str, str]]
    subcategory: str
    inputs: Callable[[Sequence[Any]], Mapping[str, Any]] = lambda jobs: {}
    params: Callable[[Sequence[Any], Mapping[str, Any]], Mapping[str, Any]] = lambda *_: {}
    wanted: Callable[[Sequence[Any]], list[dict[str, str]]] = once_if_jobs
    constraints: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.files) - set(EXTS_OF_KEYWORD)
        if unknown:
            raise ValueError(f"output keywords {sorted(unknown)} not in {sorted(EXTS_OF_KEYWORD)}")

    @property
    def wildcards(self) -> tuple[str, ...]:
        """The wildcards of the first output's stem, in order."""
        stem = next(iter(self.files.values()))[0]
        return tuple(re.findall(r"\{(\w+)\}", stem))

    def targets(self, jobs: Sequence[Any]) -> list[str]:
        """The first file of the first output for every wanted wildcard set."""
        keyword, (stem, _) = next(iter(self.files.items()))
        ext = EXTS_OF_KEYWORD[keyword][0]
        return [stem.format(**values) + ext for values in self.wanted(jobs)]

    def log(self, rule: str) -> str:
        """logs/<rule>.log, or logs/<rule>/<wildcards joined by _>.log."""
        if not self.wildcards:
            return f"logs/{rule}.log"
        return f"logs/{rule}/" + "_".join(f"{{{w}}}" for w in self.wildcards) + ".log"


def report_targets(reports: Mapping[str, ReportOutput] | Any, jobs: Sequence[Any]) -> list[str]:
    """Every target of every entry of a study's report registry, in registration order."""
    return [path for _, entry in reports.items() for path in entry.targets(jobs)]


def shown_files(reports: Mapping[str, ReportOutput] | Any, jobs: Sequence[Any]) -> list[str]:
    """The file the report shows (a table's `.html`, a figure's `.png`) of every output of
    every entry of a study's report registry, for every wanted wildcard set."""
    return [
        stem.format(**values) + (".html" if keyword == "csv_path" else ".png")
        for _, entry in reports.items()
        for values in entry.wanted(jobs)
        for keyword, (stem, _) in entry.files.items()
    ]


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


def summary_inputs(jobs: Mapping[str, Sequence[Any]]) -> dict[str, list[str]]:
    """The run files the demo summary reads, from each study's jobs (`Grid.jobs`): seg
    metrics.json and the attacked cells' attack.json (as the seg claims read them), fets
    rounds.csv, xcal metrics.json and the processed meta.json (classes, test-set size) of each
    xcal dataset."""
    from dpmed.data.registry import processed_files
    from dpmed.studies import STUDIES  # the study specs import this module

    seg, xcal = jobs.get("seg", []), jobs.get("xcal", [])
    seg_claims = STUDIES["seg"].claims
    datasets = dict.fromkeys(job.wc["dataset"] for job in xcal)
    return {
        "seg_metrics": [f"{job.path}/metrics.json" for job in seg],
        "seg_attacks": seg_claims(seg)["attack_paths"] if seg_claims else [],
        "fets_rounds": [f"{job.path}/rounds.csv" for job in jobs.get("fets", [])],
        "xcal_metrics": [f"{job.path}/metrics.json" for job in xcal],
        "xcal_meta": [
            path
            for dataset in datasets
            for path in processed_files(dataset)
            if path.endswith("/meta.json")
        ],  # fmt: skip
    }
