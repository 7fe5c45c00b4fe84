"""A bad config stops at the config check (before the first job), naming the key and value; a
table or figure the grid cannot feed is left out of the targets with a note."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG, SNAKEMAKE, run_snakemake

from dpmed.config.checks import check_config
from dpmed.errors import ConfigError
from dpmed.studies import STUDIES

SCHEMA = REPO / "config" / "schema.yaml"


@pytest.fixture
def smoke() -> dict:
    """config/smoke.yaml without its audit block, whose cells the edits below may remove."""
    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    del config["audit"]
    return config


def rejected(config: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_config(config, SCHEMA)
    return info.value


# --- 1. a seg grid that cannot feed a table or figure ---


def _fig12_without_plain_v2(config: dict) -> None:
    config["seg"]["grid"][2]["morphs"] = ["none", "both-k3", "adaptive-v2-s"]


def _table2_only_per_image(config: dict) -> None:
    config["seg"]["grid"][3]["morphs"] = ["adaptive-v1-q25-80-s"]


def _fig11_only_quantile_variants(config: dict) -> None:
    config["seg"]["grid"][2]["morphs"] = ["none", "both-k3"]


def _fig7_only_sweep_cells(config: dict) -> None:
    config["seg"]["grid"] = [config["seg"]["grid"][4]]


@pytest.mark.parametrize(
    ("edit", "target", "figure", "needed"),
    [
        (_fig12_without_plain_v2, "results/figures/seg_fig12_layers.png", "Fig. 12", "adaptive-v2"),
        (_table2_only_per_image, "results/tables/seg_table2_quantiles.csv", "Table 2", "-qL-H"),
        (_fig11_only_quantile_variants, "results/figures/seg_fig11_adaptive.png", "Fig. 11",
         "adaptive"),
        (_fig7_only_sweep_cells, "results/figures/seg_fig7_alignment.png", "Fig. 7", "finite eps"),
    ],
)  # fmt: skip
def test_a_report_the_grid_cannot_feed_is_dropped_with_a_note(smoke, edit, target, figure, needed):
    edit(smoke)
    grid = check_config(smoke, SCHEMA)
    assert target not in STUDIES["seg"].targets(grid.jobs("seg"))
    notes = [note for note in grid.notes() if figure in note]
    assert notes and needed in notes[0], grid.notes()


def test_the_smoke_and_paper_grids_feed_every_report(smoke):
    assert check_config(smoke, SCHEMA).notes() == []
    paper = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert check_config(paper, SCHEMA).notes() == []


def test_paper_figures_need_the_runs_they_show(smoke):
    """Fig. 10 shows a fixed morphology; Figs. 6 and 9 a morphology none or fixed."""
    for block in smoke["seg"]["grid"]:
        block["morphs"] = ["none"]
    grid = check_config(smoke, SCHEMA)
    made = STUDIES["seg"].targets(grid.jobs("seg"))
    assert "results/figures/seg_fig10_morph_effect.png" not in made
    assert "results/figures/seg_fig6_visual.png" in made
    assert [note for note in grid.notes() if "Fig. 10" in note and "<op>-k<k>" in note]
    smoke = yaml.safe_load(SMOKE_CONFIG.read_text())
    del smoke["audit"]
    smoke["seg"]["grid"] = [smoke["seg"]["grid"][2] | {"morphs": ["adaptive-v2"]}]
    grid = check_config(smoke, SCHEMA)
    made = STUDIES["seg"].targets(grid.jobs("seg"))
    assert "results/figures/seg_fig11_adaptive.png" in made
    for figure in ("fig6_visual", "fig9_attack", "fig10_morph_effect"):
        assert f"results/figures/seg_{figure}.png" not in made
    assert [note for note in grid.notes() if "Fig. 6" in note]
    assert [note for note in grid.notes() if "Fig. 9" in note and "`attack` on" in note]


def test_fig12_variant_is_the_one_its_writer_draws():
    from dpmed.seg.outputs import LAYER_VARIANT
    from dpmed.seg.report import adaptive

    assert adaptive.LAYER_VARIANT == LAYER_VARIANT


def test_naming_a_dropped_report_stops_before_any_job(smoke, tmp_path):
    _fig12_without_plain_v2(smoke)
    path = tmp_path / "no_v2.yaml"
    path.write_text(yaml.safe_dump(smoke))
    target = "results/figures/seg_fig12_layers.png"
    result = run_snakemake(
        "-n", "--configfile", str(path), "--directory", str(tmp_path), target, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Fig. 12" in output and "adaptive-v2" in output, output
    assert "seg_train" not in result.stdout


# --- 2. morph wildcard suffixes ---


@pytest.mark.parametrize("morph", ["adaptive-v1-q90-10", "adaptive-v2-q30-170-s"])
def test_morph_quantile_suffix_out_of_range(smoke, morph):
    smoke["seg"]["grid"][3]["morphs"][1] = morph
    error = rejected(smoke)
    assert error.key == "seg.grid[3].morphs" and morph in str(error)


# --- 3. fets patch size and depth ---


def test_fets_patch_size_must_divide_by_two_to_the_depth(smoke):
    smoke["fets"]["defaults"]["patch_size"] = [16, 16, 10]
    error = rejected(smoke)
    assert error.key == "fets.defaults.patch_size"
    assert "[16, 16, 10]" in str(error) and "fets.defaults.depth" in str(error)


def test_fets_depth_set_in_a_block_is_named(smoke):
    smoke["fets"]["grid"][0]["params"] = {"depth": 5}
    error = rejected(smoke)
    assert error.key == "fets.defaults.patch_size" and "fets.grid[0].params.depth = 5" in str(error)


def test_fets_group_norm_needs_channels_in_groups_of_eight(smoke):
    smoke["fets"]["defaults"]["base_filters"] = 3
    error = rejected(smoke)
    assert error.key == "fets.defaults.base_filters" and "3" in error.problem


# --- 4. split fractions ---


@pytest.mark.parametrize(("split", "empty"), [([0.8, 0.2, 0.0], "test"), ([0.8, 0.0, 0.2], "val")])
def test_a_split_the_seg_study_uses_cannot_be_empty(smoke, split, empty):
    smoke["data"]["duke"]["split"] = split
    error = rejected(smoke)
    assert error.key == "data.duke.split" and str(split) in str(error) and empty in error.problem


def test_a_split_too_small_for_the_synthetic_size(smoke):
    smoke["data"]["umn"]["synthetic"]["n_subjects"] = 6
    smoke["data"]["umn"]["split"] = [0.1, 0.45, 0.45]
    error = rejected(smoke)
    assert error.key == "data.umn.split" and "[0.1, 0.45, 0.45]" in str(error)
    assert "data.umn.synthetic.n_subjects = 6" in error.problem


# --- 5. seg depth against the image size ---


def test_seg_depth_too_deep_for_the_image_size(smoke):
    smoke["seg"]["defaults"]["depth"] = 6
    error = rejected(smoke)
    assert error.key == "seg.defaults.depth" and "6" in error.problem
    assert "data.duke.size" in error.problem and "[32, 32]" in error.problem


def test_seg_depth_of_a_block_is_named(smoke):
    smoke["seg"]["grid"][6]["params"]["depth"] = 6
    error = rejected(smoke)
    assert error.key == "seg.grid[6].params.depth" and "data.covidct.size" in error.problem


def test_infnet_needs_depth_three(smoke):
    smoke["seg"]["grid"][6]["params"]["depth"] = 2
    error = rejected(smoke)
    assert error.key == "seg.grid[6].params.depth" and "Inf-Net" in error.problem


def test_missing_backbone_weights_file(smoke, tmp_path):
    smoke["seg"]["grid"][6]["params"]["backbone_weights"] = str(tmp_path / "res2net.pt")
    error = rejected(smoke)
    assert error.key == "seg.grid[6].params.backbone_weights" and "res2net.pt" in error.problem


# --- 6. raw folders ---


def test_raw_must_be_a_folder_not_a_file(smoke, tmp_path):
    raw = tmp_path / "Subject_01.mat"
    raw.write_bytes(b"")
    smoke["data"]["duke"]["raw"] = str(raw)
    error = rejected(smoke)
    assert error.key == "data.duke.raw" and str(raw) in error.problem


# --- 7. YAML syntax errors ---


def test_config_checker_names_file_and_line_of_a_yaml_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("device: cpu\ndata:\n  duke: {raw: synthetic\n  umn: [1, 2\n")
    result = checker(bad)
    assert result.returncode == 1
    assert f"{bad}:4:" in result.stderr, result.stderr


def test_a_yaml_error_in_the_default_config_names_file_and_line(tmp_path):
    """Snakemake reads a --configfile before the Snakefile runs, but the default config
    (config/config.yaml beside the Snakefile) is read by the Snakefile itself."""
    for name in ("rules", "src", "workflow", "envs"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / "Snakefile").write_text((REPO / "Snakefile").read_text())
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "schema.yaml").symlink_to(SCHEMA)
    bad = tmp_path / "config" / "config.yaml"
    bad.write_text("device: cpu\ndata:\n  duke: {raw: synthetic\n  umn: [1, 2\n")
    result = subprocess.run(
        [*SNAKEMAKE, "-n", "-s", str(tmp_path / "Snakefile"), "--directory", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and f"{bad}:4:6" in result.stdout + result.stderr


def checker(*paths) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dpmed.config.checks", *map(str, paths)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)


def test_config_checker_runs_the_full_check(smoke, tmp_path):
    ok = checker(SMOKE_CONFIG)
    assert ok.returncode == 0 and "seg 33 jobs" in ok.stdout, ok.stdout + ok.stderr
    smoke["data"]["duke"]["split"] = [0.8, 0.2, 0.0]
    path = tmp_path / "zero_test.yaml"
    path.write_text(yaml.safe_dump(smoke))
    bad = checker(path)
    assert bad.returncode == 1 and "config key 'data.duke.split'" in bad.stderr, bad.stderr
