"""The RST captions of the Snakemake report (workflow/report/*.rst and each study's
src/dpmed/<study>/captions/*.rst): every `reported(...)` output of the rule files has its
caption file, no caption file is unused, and every caption renders as Snakemake renders it
(Jinja2, then docutils) with both shipped configs, as loaded and as the workflow sees them
(schema defaults filled), without a docutils warning. Jinja runs with
StrictUndefined, stricter than Snakemake (which renders a missing key as empty text), so a
mistyped config key fails here instead of vanishing from the report."""

from __future__ import annotations

import functools
import re
import tempfile
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import loaded_workflow
from docutils.core import publish_parts
from jinja2 import Environment, StrictUndefined

from dpmed.config.checks import check_config

REPO = Path(__file__).resolve().parents[1]
FRONT_PAGE = REPO / "workflow" / "report" / "workflow.rst"
# caption file name → path: the shared captions and every study package's
CAPTIONS = {
    path.name: path
    for path in sorted(
        [*FRONT_PAGE.parent.glob("*.rst"), *(REPO / "src" / "dpmed").glob("*/captions/*.rst")]
    )
}
CONFIGS = {name: REPO / "config" / f"{name}.yaml" for name in ("smoke", "config")}
SEG_DATASETS = ("duke", "umn", "covidct")
# Snakemake appends these link targets to every caption before rendering (snakemake/report).
RST_LINKS = textwrap.dedent("""

.. _Workflow: javascript:show_panel('workflow')
.. _Statistics: javascript:show_panel('statistics')
{% for cat, catresults in categories|dictsort %}
.. _{{ cat.name }}: javascript:app.showCategory('{{ cat.name|urlencode }}')
{% endfor %}
{% for res in files %}
.. _{{ res.target }}: javascript:app.showResultInfo('{{ res.path|urlencode }}')
{% endfor %}
""")
# Snakemake calls publish_parts(writer_name=...), which docutils >= 0.22 marks as deprecated.
pytestmark = pytest.mark.filterwarnings('ignore:Argument "writer_name":PendingDeprecationWarning')


def reported_captions(configfile: Path, workdir: Path) -> set[str]:
    """Caption names of every output the workflow flags for the report, read from the rules
    Snakemake itself builds from the Snakefile with `configfile` (so generated rules count)."""
    from snakemake.io import is_flagged

    with loaded_workflow(configfile, workdir) as workflow:
        return {
            Path(f.flags["report"].caption.get_filename()).stem
            for rule in workflow.rules
            for f in rule.output
            if is_flagged(f, "report")
        }


@functools.cache
def used_captions(tmp: Path) -> frozenset[str]:
    return frozenset(
        caption for path in CONFIGS.values() for caption in reported_captions(path, tmp)
    )


@functools.cache
def caption_params(config_name: str) -> tuple[dict[str, SimpleNamespace], tuple]:
    """(caption name → the params of the rule that reports it, the report's result files as
    Snakemake's caption context sees them: `target` the file name) for a shipped config."""
    from snakemake.io import is_flagged

    params, files = {}, []
    with loaded_workflow(CONFIGS[config_name], Path(tempfile.mkdtemp())) as workflow:
        for rule in workflow.rules:
            for f in rule.output:
                if is_flagged(f, "report"):
                    caption = Path(f.flags["report"].caption.get_filename()).stem
                    params[caption] = SimpleNamespace(**dict(rule.params.items()))
        shown = dict(workflow._rules["claims"].params.items())["shown"]
    files = tuple(SimpleNamespace(target=Path(p).name, path=p) for p in shown)
    return params, files


def render(path: Path, snakemake: SimpleNamespace, files: tuple = ()) -> str:
    """Jinja2 then docutils, as Snakemake's report does; any docutils warning raises (a link
    to a result file that `files` lacks among them)."""
    env = Environment(trim_blocks=True, lstrip_blocks=True, undefined=StrictUndefined)
    text = env.from_string(path.read_text() + RST_LINKS).render(
        snakemake=snakemake, categories={}, files=list(files)
    )
    overrides = {"report_level": 2, "halt_level": 2}
    return publish_parts(text, writer_name="html", settings_overrides=overrides)["html_body"]


def test_every_reported_output_has_its_caption_and_every_caption_is_used(tmp_path) -> None:
    used = used_captions(tmp_path)
    assert len(used) >= 30, sorted(used)
    present = {Path(name).stem for name in CAPTIONS} - {FRONT_PAGE.stem}
    assert not used - present, f"missing caption files: {sorted(used - present)}"
    assert not present - used, f"caption files no rule reports: {sorted(present - used)}"
    # the front page, declared in the first rule file (a path Snakemake also joins for a
    # versioned source)
    common = (REPO / "rules" / "common.smk").read_text()
    assert 'report: "../workflow/report/workflow.rst"' in common


@functools.cache
def load_config(name: str, validated: bool) -> dict:
    """config/<name>.yaml as loaded, or as the workflow sees it (schema defaults filled)."""
    config = yaml.safe_load(CONFIGS[name].read_text())
    if validated:
        check_config(config, REPO / "config" / "schema.yaml")
    return config


@pytest.mark.parametrize("validated", [False, True], ids=["yaml", "validated"])
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("caption", sorted(CAPTIONS))
def test_caption_renders_without_warnings(caption: str, config_name: str, validated: bool) -> None:
    config = load_config(config_name, validated)
    path = CAPTIONS[caption]
    files: tuple = ()
    if path == FRONT_PAGE:  # the front page sees only the config (Snakemake's global caption)
        contexts = [SimpleNamespace(config=config)]
    else:
        params = SimpleNamespace()
        if "snakemake.params" in path.read_text():  # the rule's own params, its result files
            rule_params, files = caption_params(config_name)
            params = rule_params[path.stem]
        datasets = SEG_DATASETS if "snakemake.wildcards" in path.read_text() else ("duke",)
        contexts = [
            SimpleNamespace(config=config, wildcards={"dataset": d}, params=params)
            for d in datasets
        ]
    for snakemake in contexts:
        html = render(path, snakemake, files)
        assert "{{" not in html and "{%" not in html
        assert len(re.sub(r"<[^>]+>", "", html).split()) >= 30, html  # real text, not a stub


def test_front_page_shows_the_config_in_use() -> None:
    config = load_config("smoke", validated=True)
    html = render(FRONT_PAGE, SimpleNamespace(config=config))
    assert f"seg: grid blocks {len(config['seg']['grid'])}," in html
    assert "results/measured" in html and "--report results/report.html" in html


def test_per_dataset_captions_name_their_dataset_and_paper_figure() -> None:
    config = load_config("config", validated=True)
    for dataset, figure in zip(SEG_DATASETS, ("Fig. 3", "Fig. 4", "Fig. 5"), strict=True):
        snakemake = SimpleNamespace(config=config, wildcards={"dataset": dataset}, params={})
        html = render(CAPTIONS["seg_clipping.rst"], snakemake)
        assert dataset in html and figure in html
        blocks = [b for b in config["seg"]["grid"] if dataset in b["datasets"]]
        assert render(CAPTIONS["seg_main.rst"], snakemake).count("block:") == len(blocks)


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_the_claims_captions_link_every_claims_evidence(config_name: str) -> None:
    """Every registered claim names evidence the grid's report shows, and the claims captions
    link each of those files (a renamed table or figure breaks this, not the report)."""
    rule_params, files = caption_params(config_name)
    config = load_config(config_name, True)
    for caption, key in (("claims", "evidence"), ("claims_measured", "evidence_measured")):
        evidence = getattr(rule_params[caption], key)
        assert evidence and all(evidence.values()), {c: f for c, f in evidence.items() if not f}
        snakemake = SimpleNamespace(config=config, wildcards={}, params=rule_params[caption])
        html = render(CAPTIONS[f"{caption}.rst"], snakemake, files)
        for claim, paths in evidence.items():
            item = re.search(rf"{re.escape(claim)}</span></tt>:(.*?)</li>", html, re.S)
            assert item, claim
            linked = re.findall(r"showResultInfo\('([^']+)'\)", item.group(1))
            assert linked == paths, claim


def html_tables(html: str) -> list[list[list[str]]]:
    """Each <table> of `html` as its rows of cell texts (tags stripped)."""
    cells = r"<t[hd][^>]*>(.*?)</t[hd]>"
    return [
        [
            [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(cells, row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
        ]
        for table in re.findall(r"<table.*?</table>", html, re.S)
    ]


def test_front_page_counts_the_verdicts_of_the_claims_table_per_paper(tmp_path) -> None:
    """The front page's table of verdicts per study equals the counts of a planted claims.csv
    (as the claims rule writes it), and it links the claims table and the demo summary."""
    from dpmed.report.claims import CLAIM_COLUMNS, COLUMNS, verdict_counts
    from dpmed.report.style import write_table

    rng = np.random.default_rng(0)
    papers = {"seg": "paper 002 §5.1", "fets": "paper 000 §IV", "xcal": "paper 001 §6"}
    rows = [
        {column: "" for column in CLAIM_COLUMNS}
        | {"study": study, "paper": paper, "claim": f"{study}-c{i}", "group": group,
           "verdict": rng.choice(["supported", "contradicted", "inconclusive"], p=[0.3, 0.2, 0.5]),
           "reason": "planted"}
        for study, paper in papers.items()
        for group in ("paper", "beyond")
        for i in range(int(rng.integers(2, 8)))
    ]  # fmt: skip
    cells = pd.DataFrame(
        [{c: "" for c in COLUMNS} | {"study": r["study"], "claim": r["claim"], "decides": True,
                                     "n_seeds": int(rng.integers(1, 4))} for r in rows]
    )  # fmt: skip
    tables = tmp_path / "results" / "tables"
    write_table(pd.DataFrame(rows, columns=CLAIM_COLUMNS), tables / "claims.csv")
    claims = pd.read_csv(tables / "claims.csv")  # as a reader gets it
    write_table(verdict_counts(claims, cells, "smoke.yaml"), tables / "claims_counts.csv")
    files = [
        SimpleNamespace(target=name, path=tables / name)
        for name in ("claims_counts.html", "claims.html", "demo_summary.html")
    ]
    config = load_config("smoke", validated=True)
    html = render(FRONT_PAGE, SimpleNamespace(config=config), tuple(files))
    [table] = [t for t in html_tables(html) if t and "supported" in t[0]]
    header, *body = table
    shown = {(row[header.index("study")], row[header.index("claims of")]): row for row in body}
    # counted independently: every planted claim, by study, group and verdict
    labels = {"paper": "the paper's claims", "beyond": "beyond the paper (prior work or ours)"}
    expected: dict[tuple[str, str], dict[str, int]] = {}
    for row in rows:
        by_verdict = expected.setdefault((row["study"], labels[row["group"]]), {})
        by_verdict[row["verdict"]] = by_verdict.get(row["verdict"], 0) + 1
    assert sorted(shown) == sorted(expected)
    for (study, group), by_verdict in expected.items():
        for verdict in ("supported", "contradicted", "inconclusive"):
            got = int(shown[study, group][header.index(verdict)])
            assert got == by_verdict.get(verdict, 0), (study, group)
        assert int(shown[study, group][header.index("claims")]) == sum(by_verdict.values())
        assert shown[study, group][header.index("paper")] == papers[study].split(" §")[0]
        assert shown[study, group][header.index("config")] == "smoke.yaml"
    linked = re.findall(r'href="javascript:app.showResultInfo\(([^)]*)\)"', html)
    assert any("claims.html" in link for link in linked), linked
    assert any("demo_summary.html" in link for link in linked), linked
    assert "smoke-scale" in html.split("The three studies")[0]  # the scale, before the prose
    # the rule graph: its own section, drawn below the text at full width, not beside it
    assert 'id="rule-graph"' in html and "#rulegraph { flex-basis: 100%;" in html
    # without a claims table (a grid that tests no claim) the page says so
    assert "tests no paper claim" in render(FRONT_PAGE, SimpleNamespace(config=config))
