"""The seg spec and its registries: schema enums and patterns equal the registries, validity and
targets read them, the rule file writes every target, and a new DP-Morph variant is one
registration."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, SMOKE_CONFIG, loaded_workflow

from dpmed.config.checks import check_config
from dpmed.errors import ConfigError
from dpmed.report.outputs import EXTS_OF_KEYWORD
from dpmed.seg.grid import SEG_DATASETS, invalid
from dpmed.seg.morph_ops import apply_morph, assign, thickness
from dpmed.seg.morphology import (
    ADAPTIVE_NEEDS,
    MORPHS,
    RETINAL_DATASET,
    Morph,
    has_quantiles,
    is_plain,
    morph_kind,
    morph_pattern,
    parse_morph,
)
from dpmed.seg.outputs import ATTACK_FILE, DATASET_FIGURE, REPORTS, RUN_FILES, targets
from dpmed.seg.report.adaptive import bars
from dpmed.seg.spec import SPEC

SCHEMA = REPO / "config" / "schema.yaml"


@pytest.fixture(scope="module")
def jobs():
    return check_config(yaml.safe_load(SMOKE_CONFIG.read_text()), SCHEMA).jobs("seg")


def test_the_spec_imports_without_torch_pandas_or_matplotlib():
    heavy = "{'torch', 'pandas', 'matplotlib'}"
    code = f"import sys, dpmed.studies; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "wildcard,good,bad",
    [
        ("clip", ["none", "psac", "flat-C0.5-lr0.001", "autos-C2-lr1e-05"], ["clip", "flat-C1"]),
        (
            "morph",
            ["none", "open-k3", "both-k5", "adaptive-v2", "adaptive-v1-q25-80-s", "adaptive-v3-s"],
            ["open-k4", "open-k3-s", "adaptive-v4", "adaptive-v1-q25", "erode-k3"],
        ),
        ("dataset", list(DATASET_FIGURE), ["fets", "bloodmnist"]),
        ("model", ["unet", "unetpp", "lfunet", "infnet"], ["resnet18", "resunet3d"]),
    ],
)
def test_wildcard_patterns_come_from_the_registries(wildcard, good, bad):
    pattern = re.compile(SPEC.patterns[wildcard])
    assert all(pattern.fullmatch(value) for value in good)
    assert not any(pattern.fullmatch(value) for value in bad)


def test_morph_wildcards_parse_through_the_registry():
    assert [morph_kind(m) for m in ("none", "close-k5", "adaptive-v2-s")] == [
        "none", "fixed", "adaptive"
    ]  # fmt: skip
    assert is_plain("open-k3") and is_plain("adaptive-v1") and not is_plain("adaptive-v1-s")
    assert has_quantiles("adaptive-v1-q25-80") and not has_quantiles("adaptive-v1-s")
    assert parse_morph("adaptive-v1-q25-80-s").label == "adaptive-v1"


def test_validity_reads_the_registries():
    cell = dict(dataset="duke", model="unet", clip="flat", morph="adaptive-v2", eps="8", seed="0")
    assert invalid(cell) is None
    assert invalid(cell | {"dataset": "umn"}) == ADAPTIVE_NEEDS
    assert invalid(cell | {"dataset": "umn", "morph": "open-k3"}) is None
    assert "clip 'none'" in invalid(cell | {"clip": "none"})
    assert "clip 'none'" in invalid(cell | {"eps": "inf"})
    assert "clip 'none'" in invalid(cell | {"clip": "flat-C1-lr0.001", "eps": "inf"})


def test_targets_are_every_run_file_then_the_reports(jobs):
    got = targets(jobs)
    runs = [f"{j.path}/{f}" for j in jobs for f in RUN_FILES]
    runs += [f"{j.path}/{ATTACK_FILE}" for j in jobs if j.switches["attack"]]
    assert 0 < sum(j.switches["attack"] for j in jobs) < len(jobs)  # the smoke grid has both
    assert got[: len(runs)] == runs
    reports = got[len(runs) :]
    assert reports[:6] == [
        "results/tables/seg_main_duke.csv",
        "results/tables/seg_main_umn.csv",
        "results/tables/seg_main_covidct.csv",
        "results/figures/seg_fig3_duke.png",
        "results/figures/seg_fig4_umn.png",
        "results/figures/seg_fig5_covidct.png",
    ]
    single = [t for _, r in REPORTS.items() if not r.wildcards for t in r.targets(jobs)]
    assert len(single) == len(REPORTS) - 2  # the smoke grid has every kind of cell
    assert reports[6:] == single
    assert targets([]) == []


def _seg_grid(*blocks):
    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    config["seg"]["grid"] = list(blocks)
    config.pop("audit")  # its cells name runs of the smoke grid
    return check_config(config, SCHEMA)


_CELL = {"datasets": ["duke"], "models": ["unet"], "clips": ["none"], "morphs": ["none"],
         "eps": ["inf"], "seeds": [0]}  # fmt: skip


def test_a_block_without_the_attack_trains_the_same_and_is_not_scored():
    other = _CELL | {"models": ["unetpp"]}
    scored, unscored = _seg_grid(_CELL, other), _seg_grid(_CELL, other | {"attack": False})
    unet, unetpp = (f"results/seg/duke/{m}/none/none/epsinf/seed0" for m in ("unet", "unetpp"))
    assert {f"{unet}/{ATTACK_FILE}", f"{unetpp}/{ATTACK_FILE}"} <= set(targets(scored.jobs("seg")))
    got = targets(unscored.jobs("seg"))
    assert f"{unet}/{ATTACK_FILE}" in got and f"{unetpp}/{ATTACK_FILE}" not in got
    assert {f"{unetpp}/{name}" for name in RUN_FILES} <= set(got)
    report = REPORTS["seg_attack_report"]
    assert report.inputs(unscored.jobs("seg"))["attack_paths"] == [f"{unet}/{ATTACK_FILE}"]
    # a switch, not a hyperparameter: flipping it leaves the training rule's params alone
    wildcards = dict(dataset="duke", model="unetpp", clip="none", morph="none", eps="inf", seed="0")
    assert scored.params("seg", wildcards) == unscored.params("seg", wildcards)


def test_a_grid_without_attacked_cells_has_no_attack_report():
    grid = _seg_grid(_CELL | {"attack": False})
    assert not [t for t in targets(grid.jobs("seg")) if "attack" in t]
    assert any("seg_attack_report" in note for note in grid.notes())


def test_one_cell_with_two_attack_values_is_a_config_error():
    with pytest.raises(ConfigError, match=r"seg\.grid\[1\].*also in seg\.grid\[0\].*attack"):
        _seg_grid(_CELL, _CELL | {"attack": False})


def test_reports_follow_the_cells_of_the_grid(jobs):
    plain = [j for j in jobs if j.wc["eps"] == "inf" and j.wc["morph"] == "none"]
    runs = len(plain) * len(RUN_FILES) + sum(j.switches["attack"] for j in plain)
    reports = targets(plain)[runs:]
    per_dataset = [f"results/tables/seg_main_{d}.csv" for d in SEG_DATASETS]
    per_dataset += [f"results/figures/seg_{DATASET_FIGURE[d]}_{d}.png" for d in SEG_DATASETS]
    paper = [
        "results/measured/seg_fig8_training_time.png",
        "results/figures/seg_fig1_examples.png",
        "results/figures/seg_fig6_visual.png",
        "results/figures/seg_fig9_attack.png",
        "results/tables/seg_table1_clip_rules.csv",
    ]
    assert (
        reports == per_dataset + paper
    )  # no private, sweep, quantile, adaptive or fixed-morph cells
    duke_private = [j for j in jobs if j.wc["dataset"] == "duke" and j.wc["clip"] != "none"]
    reports = targets(duke_private)
    assert "results/tables/seg_main_umn.csv" not in reports
    assert "results/figures/seg_fig12_layers.png" in reports  # adaptive duke cells


def test_every_report_entry_is_a_generated_rule_writing_its_files(tmp_path):
    with loaded_workflow(SMOKE_CONFIG, tmp_path) as workflow:
        for name, entry in REPORTS.items():
            # Snakemake writes the rule's wildcard constraints into its outputs: drop them.
            written = [
                re.sub(r"\{(\w+),[^}]*\}", r"{\1}", str(f)) for f in workflow.get_rule(name).output
            ]
            expected = [
                stem + ext
                for keyword, (stem, _) in entry.files.items()
                for ext in EXTS_OF_KEYWORD[keyword]
            ]
            assert written == expected, name
            assert name in workflow._localrules


def test_a_new_adaptive_variant_is_one_registration():
    MORPHS.add(
        "adaptive-v4", Morph("adaptive", "close", datasets=(RETINAL_DATASET,), why=ADAPTIVE_NEEDS)
    )
    try:
        spec = parse_morph("adaptive-v4-q25-80-s")
        assert (spec.name, spec.op, spec.quantiles, spec.scope) == (
            "adaptive-v4", "close", (25.0, 80.0), "sample"
        )  # fmt: skip
        assert re.fullmatch(morph_pattern(), "adaptive-v4-s")
        cell = dict(dataset="umn", model="unet", clip="flat", morph="adaptive-v4", eps="8")
        assert invalid(cell) == ADAPTIVE_NEEDS and invalid(cell | {"dataset": "duke"}) is None
        torch.manual_seed(0)
        logits = torch.randn(2, 9, 12, 12)
        _, used = apply_morph(parse_morph("adaptive-v4"), logits)
        expected = assign(thickness(logits), "close", (20.0, 85.0), "batch")
        assert torch.equal(used.codes, expected.codes)
        categories = bars()  # Fig. 11
        assert [c[0] for c in categories] == [
            "none", "fixed", "v1", "v2", "v3", "v4", "v1-s", "v2-s", "v3-s", "v4-s"
        ]  # fmt: skip
        assert categories[5] == ("v4", "adaptive v4", 5, False)
        assert categories[-1] == ("v4-s", "adaptive v4, per-image", 5, True)
    finally:
        MORPHS.remove("adaptive-v4")
    with pytest.raises(ValueError, match="adaptive-v4"):
        parse_morph("adaptive-v4")
