"""The requests, job counts and durations a cluster user reads are the code's: docs/cluster.md
holds the output of `python -m dpmed.job_cost --markdown` for the paper config between two
marker comments, and the README, docs/cluster.md and config/README.md state no such number
outside it (the numbers that went stale: a GPU bound of ~68 GB, a 48 h fets request, 3,286 GPU
jobs, 518 submissions, an empty `audit` block)."""

from __future__ import annotations

import re

from conftest import REPO

from dpmed import job_cost
from dpmed.config.checks import checked_configs

CLUSTER = REPO / "docs" / "cluster.md"
BEGIN, END = "<!-- job_cost:begin -->", "<!-- job_cost:end -->"
REFRESH = "python -m dpmed.job_cost --markdown"
# Phrases that state a request, a job count or a duration: a number, at most two words, a unit;
# or the paper config's `audit` block said to be empty. A paper's value (its clause names a
# paper, e.g. "paper 000 Table II's ≈ 8,300 simulated minutes") is not the grid's.
STATED = re.compile(
    r"\d[\d,.]*(?:[\s-]+[A-Za-z]+){0,2}?[\s-]*"
    r"(?:GB|MB|hours?|minutes?|min|jobs|submissions|cells|runs|probes)\b"
    r"|`audit`[^\n]*`\{\}` \(no cells\)",
)
CLAUSE = re.compile(r"[;|(\n]")
PAPER = re.compile(r"\bpaper \d{3}\b")
# The README's two commands: `make demo`'s wall-time target (a target, not a measurement).
MEASURED = "## The two commands"


def included(text: str) -> str:
    """What `text` holds between the job_cost markers."""
    assert BEGIN in text and END in text, f"docs/cluster.md lost its {BEGIN} … {END} markers"
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def outside(text: str) -> str:
    """`text` without the generated block, the README's measured section, and code blocks
    (commands and examples)."""
    for begin, end in ((BEGIN, END), (MEASURED, "\n## ")):
        if begin in text:
            head, rest = text.split(begin, 1)
            text = head + (rest.split(end, 1)[1] if end in rest else "")
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_the_cluster_page_holds_the_generated_requests():
    _, config, grid = checked_configs("dpmed.job_cost", None, [])
    expected = job_cost.markdown(config, job_cost.grid_requests(config, grid))
    assert included(CLUSTER.read_text()) == expected, (
        f"docs/cluster.md disagrees with the code: paste the output of `{REFRESH}` "
        f"between {BEGIN} and {END}"
    )


def test_the_generated_block_counts_every_gpu_job_of_the_grid():
    """The block's total equals the jobs of each sized rule plus the audit jobs, counted apart."""
    from dpmed.config.audit import audit_jobs
    from dpmed.sizing import sized_rules

    _, config, grid = checked_configs("dpmed.job_cost", None, [])
    total = sum(len(grid.jobs(study)) for study in sized_rules().values())
    total += len(audit_jobs(config, grid))
    row = re.search(r"^\| all \| (\d+) \| (\d+) \|", included(CLUSTER.read_text()), re.M)
    assert row and int(row[1]) == int(row[2]) == total


def stated(text: str) -> list[str]:
    """The phrases of `text` (already `outside`) that state a request, count or duration."""
    return [
        m.group(0)
        for m in STATED.finditer(text)
        if not PAPER.search(CLAUSE.split(text[: m.start()])[-1])
    ]


def test_no_page_states_a_request_count_or_duration_outside_the_generated_block():
    pages = {
        path: outside(path.read_text())
        for path in (REPO / "README.md", CLUSTER, REPO / "config" / "README.md")
    }
    found = {path.name: stated(text) for path, text in pages.items()}
    assert {name: phrases for name, phrases in found.items() if phrases} == {}


def test_the_check_catches_the_stale_numbers():
    stale = (
        "With the paper config the GPU bound reaches about 68 GB, "
        "`fets_train` asks for the 48-hour cap; The grid has 3,286 GPU jobs: "
        "518 GPU submissions.\n| `audit` | … | `{}` (no cells) |"
    )
    assert stated(outside(stale)) == [
        "68 GB", "48-hour", "3,286 GPU jobs", "518 GPU submissions", "`audit` | … | `{}` (no cells)"
    ]  # fmt: skip
    assert stated(outside(f"{MEASURED}\n\ntakes 20 minutes\n\n## Next\n")) == []
    assert stated("as paper 000 Table II's 8,300 simulated minutes") == []
