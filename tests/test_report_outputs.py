"""Tables and figures as registry entries (dpmed.report.outputs): the entry's targets, log
path and wildcards, and that one registered entry is all the workflow needs — rules/report.smk
generates its rule, flags its output for the report with its caption, and `rule all` asks for
it."""

from __future__ import annotations

import pytest
from conftest import SMOKE_CONFIG, loaded_workflow

from dpmed.report.outputs import ReportOutput, menu_name
from dpmed.seg import outputs as seg_spec


class _Job:
    def __init__(self, dataset: str) -> None:
        self.wc = {"dataset": dataset}
        self.path = f"results/seg/{dataset}"


def test_targets_log_and_wildcards_of_an_entry():
    per_dataset = ReportOutput(
        "m:f",
        {"png_path": ("results/figures/x_{fig}_{dataset}", "cap"), "csv_path": ("t/x", "c2")},
        "Fig. 0",
        wanted=lambda jobs: [{"fig": "f1", "dataset": j.wc["dataset"]} for j in jobs],
    )
    jobs = [_Job("duke"), _Job("umn")]
    assert per_dataset.targets(jobs) == [
        "results/figures/x_f1_duke.png",
        "results/figures/x_f1_umn.png",
    ]
    assert per_dataset.wildcards == ("fig", "dataset")
    assert per_dataset.log("r") == "logs/r/{fig}_{dataset}.log"
    once = ReportOutput("m:f", {"csv_path": ("results/tables/y", "cap")}, "Table 0")
    assert once.targets(jobs) == ["results/tables/y.csv"] and once.targets([]) == []
    assert once.log("r") == "logs/r.log"


def test_an_output_keyword_must_say_what_it_is():
    with pytest.raises(ValueError, match="svg_path"):
        ReportOutput("m:f", {"svg_path": ("results/figures/z", "cap")}, "Fig. 0")


def test_one_registered_entry_becomes_a_reported_rule_that_rule_all_asks_for(tmp_path):
    from snakemake.io import is_flagged

    toy = ReportOutput(
        "dpmed.seg.report.main:training_time_figure",
        {"png_path": ("results/figures/seg_toy_figure", "seg_fig8")},
        "Fig. 99",
        inputs=lambda jobs: {"metrics_paths": seg_spec.run_files(jobs, "metrics.json")},
    )
    seg_spec.REPORTS.add("seg_toy_figure", toy)
    try:
        with loaded_workflow(SMOKE_CONFIG, tmp_path) as workflow:
            rule = workflow.get_rule("seg_toy_figure")
            outputs = {str(f): f for f in rule.output}
            shown = outputs["results/figures/seg_toy_figure.png"]
            assert "results/figures/seg_toy_figure.pdf" in outputs
            assert is_flagged(shown, "report")
            assert shown.flags["report"].subcategory == menu_name("Fig. 99")
            assert shown.flags["report"].caption.get_filename() == "seg_fig8.rst"
            assert "seg_toy_figure" in workflow._localrules and rule.params.writer == toy.writer
            # one metrics.json per seg run of the grid the Snakefile checked
            assert len(rule.input) == len(workflow.globals["GRID"].jobs("seg"))
            wanted = {str(f) for f in workflow.get_rule("all").input}
            assert "results/figures/seg_toy_figure.png" in wanted
    finally:
        seg_spec.REPORTS.remove("seg_toy_figure")
    assert "seg_toy_figure" not in seg_spec.REPORTS
