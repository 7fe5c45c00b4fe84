"""Visual seg figures (paper 002 Figs. 1, 6, 10): the morphology effect maps on hand-made logits,
the example and run choices on hand-made tables, and the figures end to end on tiny runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, SEG_PARAMS, unit_duke_config
from test_seg_train import train

from dpmed.data.stage import preprocess, synthesize
from dpmed.seg.morphology import parse_morph
from dpmed.seg.report.visual import (
    example_index,
    examples_figure,
    morph_effect_figure,
    morph_effect_maps,
    select_morph_runs,
    select_visual_runs,
    visual_figure,
)

PARAMS = SEG_PARAMS | {"epochs": 1, "width": 4, "depth": 2}
# (dataset, model, clip, morph, eps): a non-private and a private Duke run sharing a fixed
# morphology, and a COVID CT run without morphology.
RUNS = (
    ("duke", "unet", "none", "close-k3", "inf"),
    ("duke", "unet", "flat", "close-k3", "50"),
    ("covidct", "unet", "none", "none", "inf"),
)


def square_with_hole() -> torch.Tensor:
    """Two-class logits (2, 9, 9): class 1 wins (+1 vs 0) on the square rows/cols 2–6 except
    its centre (4, 4), where class 1 has −1; class 1 has −1 outside the square."""
    logits = torch.zeros(2, 9, 9)
    logits[1] = -1.0
    logits[1, 2:7, 2:7] = 1.0
    logits[1, 4, 4] = -1.0
    return logits


def test_closing_fills_a_one_pixel_hole_that_the_truth_does_not_have():
    gt = np.zeros((9, 9), dtype=np.int64)
    gt[2:7, 2:7] = 1
    before, after, corrected, new_errors = morph_effect_maps(
        square_with_hole(), parse_morph("close-k3"), gt
    )
    expected_before = gt.copy()
    expected_before[4, 4] = 0
    np.testing.assert_array_equal(before, expected_before)
    np.testing.assert_array_equal(after, gt)
    assert corrected.sum() == 1 and corrected[4, 4]
    assert not new_errors.any()


def test_closing_fills_a_hole_that_the_truth_has_which_is_a_new_error():
    gt = np.zeros((9, 9), dtype=np.int64)
    gt[2:7, 2:7] = 1
    gt[4, 4] = 0
    _, after, corrected, new_errors = morph_effect_maps(
        square_with_hole(), parse_morph("close-k3"), gt
    )
    assert after[4, 4] == 1
    assert new_errors.sum() == 1 and new_errors[4, 4]
    assert not corrected.any()


def test_opening_removes_a_true_one_pixel_line():
    logits = torch.zeros(2, 7, 7)
    logits[1] = -1.0
    logits[1, 3, 1:6] = 1.0
    gt = (logits[1] > 0).long().numpy()
    before, after, corrected, new_errors = morph_effect_maps(logits, parse_morph("open-k3"), gt)
    np.testing.assert_array_equal(before, gt)
    assert not after.any()
    np.testing.assert_array_equal(new_errors, gt == 1)
    assert not corrected.any()


def test_example_is_the_image_with_most_classes_then_most_foreground():
    masks = np.zeros((4, 3, 3), dtype=np.uint8)
    masks[0, 0, :] = 1  # one class, 3 px
    masks[1, 0, 0], masks[1, 1, 0] = 1, 2  # two classes, 2 px
    masks[2, 0, :2], masks[2, 1, 0] = 1, 2  # two classes, 3 px
    masks[3] = masks[2]  # tie with image 2 → the lower index
    assert example_index(masks) == 2
    assert example_index(np.zeros((3, 2, 2))) == 0
    with pytest.raises(ValueError):
        example_index(np.zeros((0, 2, 2)))


def table(rows: list[tuple]) -> pd.DataFrame:
    """A run table as `run_table` builds it, from (dataset, model, clip, morph, eps, seed)."""
    frame = pd.DataFrame(rows, columns=["dataset", "model", "clip", "morph", "eps", "seed"])
    return frame.assign(run_dir=[f"run{i}" for i in range(len(rows))])


def test_visual_choice_model_morph_and_cells():
    inf = math.inf
    runs = table(
        [
            ("duke", "unetpp", "flat", "both-k3", 50.0, 0),  # one rule only
            ("duke", "unet", "none", "none", inf, 0),
            ("duke", "unet", "none", "open-k3", inf, 1),
            ("duke", "unet", "none", "open-k3", inf, 0),
            ("duke", "unet", "psac", "open-k3", 50.0, 0),
            ("duke", "unet", "psac", "open-k3", 200.0, 0),
            ("duke", "unet", "nsgd", "none", 50.0, 0),
            ("duke", "unet", "nsgd", "adaptive-v1", 50.0, 0),  # adaptive: not used
            ("duke", "unet", "flat-C0.5-lr0.001", "open-k3", 50.0, 0),  # sweep: not used
            ("umn", "lfunet", "none", "none", inf, 0),
            ("covidct", "infnet", "flat", "none", 50.0, 0),  # dataset not asked for
        ]
    )
    chosen = select_visual_runs(runs, ["duke", "umn"])
    # unet has 3 plain rules; open-k3 and none both cover 2 of them → the fixed one
    assert list(chosen["run_dir"]) == ["run3", "run5", "run9"]
    assert select_visual_runs(runs, ["covidct"])["run_dir"].tolist() == ["run10"]
    assert select_visual_runs(runs.iloc[[7, 8]], ["duke"]).empty


def test_morph_effect_choice_prefers_non_private_fixed():
    runs = table(
        [
            ("duke", "unet", "autos", "close-k3", 50.0, 0),
            ("duke", "unet", "flat", "close-k5", 50.0, 0),
            ("duke", "unetpp", "none", "none", math.inf, 0),
            ("umn", "unet", "none", "open-k5", math.inf, 1),
            ("umn", "infnet", "none", "both-k3", math.inf, 0),
            ("umn", "unet", "none", "close-k3", math.inf, 2),
        ]
    )
    chosen = select_morph_runs(runs, ["duke", "umn", "covidct"])
    # duke: no non-private fixed run → flat comes before autos in report order; umn: unet before
    # infnet, then the morphology name (close-k3 < open-k5)
    assert list(chosen["run_dir"]) == ["run1", "run5"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """Processed synthetic Duke and COVID CT and the tiny runs of `RUNS` in the results layout."""
    smoke = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())["data"]
    smoke["duke"] = unit_duke_config()
    root = tmp_path_factory.mktemp("seg_visual")
    processed = {}
    for dataset in ("duke", "covidct"):
        synthesize(dataset, smoke[dataset], root / dataset / "raw")
        preprocess(dataset, smoke[dataset], root / dataset / "raw", root / dataset / "processed")
        processed[dataset] = str(root / dataset / "processed")
    models = []
    for dataset, model, clip, morph, eps in RUNS:
        wc = dict(dataset=dataset, model=model, clip=clip, morph=morph, eps=eps, seed="0")
        run_dir = root / "results" / "seg" / dataset / model / clip / morph / f"eps{eps}" / "seed0"
        train(processed[dataset], run_dir, wc, PARAMS, 0)
        models.append(str(run_dir / "model.pt"))
    return {"processed": processed, "models": models, "root": root}


def render_twice(draw, tmp_path) -> None:
    """Draw into two folders and check png + pdf exist and are byte-identical."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        draw(tmp_path / name / "fig.png")
    for ext in (".png", ".pdf"):
        first, second = (tmp_path / name / f"fig{ext}" for name in ("a", "b"))
        assert first.stat().st_size > 0
        assert first.read_bytes() == second.read_bytes()


def test_examples_figure_is_deterministic(tiny, tmp_path):
    render_twice(lambda png: examples_figure(tiny["processed"], png), tmp_path)
    with pytest.raises(ValueError, match="no seg dataset"):
        examples_figure({"bloodmnist": tiny["root"]}, tmp_path / "x.png")


@pytest.mark.parametrize("figure", [visual_figure, morph_effect_figure])
def test_run_figures_are_deterministic(tiny, tmp_path, figure):
    render_twice(lambda png: figure(tiny["models"], tiny["processed"], png), tmp_path)


@pytest.mark.parametrize("figure", [visual_figure, morph_effect_figure])
def test_run_figures_reject_unusable_input(tiny, tmp_path, figure):
    png = tmp_path / "x.png"
    with pytest.raises(ValueError, match="no usable seg run"):
        figure([], tiny["processed"], png)
    with pytest.raises(ValueError, match="no usable seg run"):
        figure(tiny["models"], {"umn": tiny["root"]}, png)
    assert not png.exists()
