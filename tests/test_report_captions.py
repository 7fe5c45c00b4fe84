"""The RST captions of the Snakemake report (workflow/report/*.rst): every `reported(...)` output
of rules/*.smk has its caption file, no caption file is unused, and every caption renders as
Snakemake renders it (Jinja2, then docutils) with both shipped configs, as loaded and as the
workflow sees them (schema defaults filled), without a docutils warning. Jinja runs with
StrictUndefined, stricter than Snakemake (which renders a missing key as empty text), so a
mistyped config key fails here instead of vanishing from the report."""

from __future__ import annotations

import ast
import functools
import importlib
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from docutils.core import publish_parts
from jinja2 import Environment, StrictUndefined

from dpmed.config.checks import check_config

REPO = Path(__file__).resolve().parents[1]
CAPTIONS = REPO / "workflow" / "report"
FRONT_PAGE = CAPTIONS / "workflow.rst"
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
# A `reported(stem, exts, caption, ...)` call: the caption is a string, f-string or name.
CALL = re.compile(r"(?<!def )\breported\(\s*f?\"[^\"]*\"\s*,\s*\w+\s*,\s*(f?\"[^\"]*\"|\w+)\s*,")
LOOP = re.compile(r"\bfor\s+(\w+)\s+in\s+(\w+)\b")
IMPORT = re.compile(r"^from\s+([\w.]+)\s+import\s+(.+)$", re.MULTILINE)
# Snakemake calls publish_parts(writer_name=...), which docutils >= 0.22 marks as deprecated.
pytestmark = pytest.mark.filterwarnings('ignore:Argument "writer_name":PendingDeprecationWarning')


def imported_names(text: str) -> dict[str, tuple[str, str]]:
    """(module, name) of every `from module import NAME [as ALIAS], ...` line of a rule file,
    by the alias the file uses."""
    names = {}
    for module, imports in IMPORT.findall(text):
        for item in imports.split(","):
            name, _, alias = item.strip().partition(" as ")
            names[alias or name] = (module, name)
    return names


def captions_of(text: str) -> list[str]:
    """Caption names of every `reported(...)` call in a rule file. A caption built from a loop
    variable (`for name in XCAL_TABLES ... reported(..., name, ...)` or `f"{name}_figure"`) is
    expanded over the imported sequence the nearest preceding `for` iterates."""
    names = imported_names(text)
    captions = []
    for match in CALL.finditer(text):
        arg = match.group(1)
        if arg.startswith('"'):
            captions.append(ast.literal_eval(arg))
            continue
        var, iterable = LOOP.findall(text[: match.start()])[-1]
        template = arg[1:].strip('"') if arg.startswith("f") else "{" + arg + "}"
        values = getattr(importlib.import_module(names[iterable][0]), names[iterable][1])
        captions += [template.format(**{var: value}) for value in values]
    return captions


def used_captions() -> set[str]:
    return {
        c for smk in sorted((REPO / "rules").glob("*.smk")) for c in captions_of(smk.read_text())
    }


def render(path: Path, snakemake: SimpleNamespace) -> str:
    """Jinja2 then docutils, as Snakemake's report does; any docutils warning raises."""
    env = Environment(trim_blocks=True, lstrip_blocks=True, undefined=StrictUndefined)
    text = env.from_string(path.read_text() + RST_LINKS).render(
        snakemake=snakemake, categories={}, files=[]
    )
    overrides = {"report_level": 2, "halt_level": 2}
    return publish_parts(text, writer_name="html", settings_overrides=overrides)["html_body"]


def test_caption_parser_reads_every_form() -> None:
    text = textwrap.dedent("""
        from dpmed.xcal.report import FIGURES as XCAL_FIGURES
        def reported(stem, exts, caption, category, subcategory):
        rule a:
            output:
                reported("results/tables/x", TAB, "plain", CAT, "Fig. 1"),
                reported(
                    "results/figures/y",
                    FIG,
                    "multi_line",
                    CAT,
                ),
                [f for name in XCAL_FIGURES for f in reported(
                    f"results/figures/{name}", FIG, f"{name}_figure", CAT, G[name])],
    """)
    from dpmed.xcal.report import FIGURES

    assert captions_of(text) == ["plain", "multi_line", *(f"{n}_figure" for n in FIGURES)]


def test_every_reported_output_has_its_caption_and_every_caption_is_used() -> None:
    used = used_captions()
    assert len(used) >= 30, sorted(used)
    present = {p.stem for p in CAPTIONS.glob("*.rst")} - {FRONT_PAGE.stem}
    assert not used - present, f"missing caption files: {sorted(used - present)}"
    assert not present - used, f"caption files no rule reports: {sorted(present - used)}"
    assert 'report: "workflow/report/workflow.rst"' in (REPO / "Snakefile").read_text()


@functools.cache
def load_config(name: str, validated: bool) -> dict:
    """config/<name>.yaml as loaded, or as the workflow sees it (schema defaults filled)."""
    config = yaml.safe_load(CONFIGS[name].read_text())
    if validated:
        check_config(config, REPO / "config" / "schema.yaml")
    return config


@pytest.mark.parametrize("validated", [False, True], ids=["yaml", "validated"])
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("caption", sorted(p.name for p in CAPTIONS.glob("*.rst")))
def test_caption_renders_without_warnings(caption: str, config_name: str, validated: bool) -> None:
    config = load_config(config_name, validated)
    path = CAPTIONS / caption
    if path == FRONT_PAGE:  # the front page sees only the config (Snakemake's global caption)
        contexts = [SimpleNamespace(config=config)]
    else:
        datasets = SEG_DATASETS if "snakemake.wildcards" in path.read_text() else ("duke",)
        contexts = [
            SimpleNamespace(config=config, wildcards={"dataset": d}, params={}) for d in datasets
        ]
    for snakemake in contexts:
        html = render(path, snakemake)
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
        html = render(CAPTIONS / "seg_clipping.rst", snakemake)
        assert dataset in html and figure in html
        blocks = [b for b in config["seg"]["grid"] if dataset in b["datasets"]]
        assert render(CAPTIONS / "seg_main.rst", snakemake).count("block:") == len(blocks)
