"""No document states a result number the run does not produce.

The rule, applied to docs/*.md and workflow/report/*.rst (captions: Jinja blocks and inline
literals removed first):
- A document is cut into units: a sentence of prose, a list item, or a table row read with its
  table's header. A worked example (a block of lines opening with "Example") is arithmetic and
  is skipped.
- A unit is about a result when it names a measured quantity (Dice, F1, AUC, ROAD, accuracy,
  HD95, MAE, TPR/FPR, advantage, leakage, a score).
- In such a unit every decimal number (a number written with a decimal point, e.g. 0.64, 27.3,
  −1.9) is a stated result unless it is
  - a value of a shipped config (config/smoke.yaml, config/config.yaml: lr 0.02, ε 0.5, ...),
    written as the config writes it (0.6, not 0.60; either sign),
  - a paper's value: it comes after a mention of a paper ("paper", "paper 002's", "§5.1") in
    its clause (cut at ; and —), or stands in "double quotes" (a quotation),
  - or a number the run prints in results/demo_summary.md, written as the summary writes it
    (rounded copies are not accepted: with hundreds of printed values, nearly any two-decimal
    number would match one of them).
  Section numbers (§4.2), integers, and decimals outside such units (seconds, minutes, factors)
  are not results of a run and are not checked.
A number stated before the paper it is compared with ("0.76, as paper 002 finds") counts as
the demo's. So a measured number belongs in the generated summary (or a table the report
builds), and the prose links it; a number copied from an earlier run fails as soon as the run
no longer produces it. The checker flags docs/demo.md as it stood before the summary existed
(commit f619088): Dice 0.81, F1 0.64, ROAD 27.3, AUC 0.57 and the rest.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = (REPO / "config" / "smoke.yaml", REPO / "config" / "config.yaml")
DOCUMENTS = [
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "workflow/report").glob("*.rst")),
    *sorted((REPO / "src/dpmed").glob("*/captions/*.rst")),
]
# The demo page before its numbers were generated (issue 43): the checker must flag it.
STALE_DEMO = ("f619088", "docs/demo.md")

RESULT_WORDS = re.compile(
    r"\b(dice|f1|auc|road|accuracy|hd95|mae|tpr|fpr|advantage|leak\w*|scores?)\b", re.I
)
DECIMAL = re.compile(r"(?<![\w.§])[−-]?\d+\.\d+(?!\w|\.\d)")
PAPER = re.compile(r"\bpapers?\b|§", re.I)
QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”")
CLAUSE = re.compile(r"[;—]")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\[`])")
ABBREVIATION = re.compile(r"\b(e\.g|i\.e|Figs?|Eqs?|al|vs|cf)\.$")
TEMPLATE = re.compile(r"\{%.*?%\}|\{\{.*?\}\}|``.*?``", re.S)


def _sentences(paragraph: str) -> Iterator[str]:
    sentences: list[str] = []
    for piece in SENTENCE_END.split(paragraph):
        if sentences and ABBREVIATION.search(sentences[-1]):
            sentences[-1] += f" {piece}"
        else:
            sentences.append(piece)
    yield from filter(None, sentences)


def _units(text: str) -> Iterator[str]:
    """Sentences, list items and table rows (each with its header) of a Markdown/RST text,
    without worked examples (a block of lines that opens with "Example")."""
    for block in re.split(r"\n\s*\n", TEMPLATE.sub(" ", text)):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if not lines or lines[0].startswith("Example"):
            continue
        if lines[0].startswith("|"):
            header, *rows = lines
            yield from (f"{header} {row}" for row in rows if not set(row) <= set("|-: "))
            continue
        items: list[list[str]] = []
        for line in lines:
            if not items or line.startswith(("- ", "* ", "#")):
                items.append([])
            items[-1].append(line)
        for item in items:
            yield from _sentences(" ".join(item))


def _numbers(values: object) -> Iterator[float]:
    if isinstance(values, dict):
        values = list(values.values())
    if isinstance(values, list):
        for value in values:
            yield from _numbers(value)
    elif isinstance(values, (int, float)) and not isinstance(values, bool):
        yield float(values)


def config_values(paths: Iterable[Path] = CONFIGS) -> set[str]:
    """Every number a shipped config sets, as Python writes it (0.6, not 0.60: a trailing zero
    is a measured precision, not the config's value)."""
    return {repr(v) for path in paths for v in _numbers(yaml.safe_load(path.read_text()))}


def stated_results(text: str, config: set[str], printed: set[str] = frozenset()) -> list[str]:
    """The decimal numbers of `text` that state a result the run does not produce (the rule of
    this module's docstring), each as 'number: unit'."""
    flagged = []
    for unit in _units(text):
        if not RESULT_WORDS.search(unit):
            continue
        for clause in CLAUSE.split(QUOTED.sub(" ", unit)):
            mention = PAPER.search(clause)
            for number in DECIMAL.findall(clause[: mention.start()] if mention else clause):
                if number.lstrip("−-") in config | printed:
                    continue
                flagged.append(f"{number}: {unit.strip()[:160]}")
    return flagged


def printed_numbers(summary: str) -> set[str]:
    """Every decimal number written in the generated summary, as written (without its sign)."""
    return {number.lstrip("−-") for number in DECIMAL.findall(summary)}


def test_units_read_table_rows_with_their_header_and_split_sentences():
    text = (
        "| cell | Dice |\n|---|---|\n| a | 0.81 |\n\nIt ran. Dice was 0.5 here (e.g. Fig.\n"
        "3).\n- item F1\n\nExample: Dice 0.25.\n- HD95 2.3"
    )
    assert list(_units(text)) == ["| cell | Dice | | a | 0.81 |", "It ran.",
                                  "Dice was 0.5 here (e.g. Fig. 3).", "- item F1"]  # fmt: skip


def test_rule_flags_measured_decimals_and_passes_config_paper_and_produced_numbers():
    config = {"0.02"}
    assert stated_results("Dice reached 0.81 at lr 0.02.", config) == [
        "0.81: Dice reached 0.81 at lr 0.02."
    ]
    assert stated_results("Dice reached 0.8103.", config, printed={"0.8103"}) == []
    assert stated_results("Dice reached 0.81.", config, printed={"0.8103"}) != []
    assert stated_results("The paper reports Dice 0.83 on Duke.", config) == []
    assert stated_results('Paper 001 says "ROAD 80.57 %".', config) == []
    assert stated_results('It quotes "ROAD 80.57 %" and Dice 0.5.', config) == [
        '0.5: It quotes "ROAD 80.57 %" and Dice 0.5.'
    ]
    assert stated_results("The rules keep Dice 0.76, as paper 002 finds.", config) != []
    assert stated_results("Paper 002's claim — with one seed, Dice 0.15.", config) != []
    assert stated_results("Dice in §4.2 of paper 002.", config) == []
    # not about a result: durations, ratios
    assert stated_results("A loop takes 3.9 s alone, 1.1 times faster.", config) == []
    assert stated_results("ROAD −1.9 against −0.4.", config) == [
        "−1.9: ROAD −1.9 against −0.4.",
        "−0.4: ROAD −1.9 against −0.4.",
    ]


def _stale_demo() -> str:
    commit, path = STALE_DEMO
    shown = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True,
                           text=True, check=False)  # fmt: skip
    if shown.returncode != 0:
        pytest.skip(f"{commit} not in this clone's history")
    return shown.stdout


def test_rule_flags_the_demo_page_as_it_stood_before_the_summary():
    flagged = stated_results(_stale_demo(), config_values())
    numbers = {entry.split(":")[0] for entry in flagged}
    # the examples: BloodMNIST F1, COVID-19 CT Dice, ROAD, the attack's AUC
    assert {"0.64", "0.78", "0.83", "27.3", "10.2", "0.57", "0.60"} <= numbers, flagged


@pytest.mark.slow
def test_documents_state_only_results_the_smoke_run_produces(smoke_run):
    summary = (smoke_run / "results/demo_summary.md").read_text()
    config, printed = config_values(), printed_numbers(summary)
    flagged = {
        str(path.relative_to(REPO)): found
        for path in DOCUMENTS
        if (found := stated_results(path.read_text(), config, printed))
    }
    assert not flagged, flagged
