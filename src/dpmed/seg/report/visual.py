"""Visual figures of the seg study (paper 002): Fig. 1 (one input and its ground-truth mask per
dataset), Fig. 6 (predictions per clip rule) and Fig. 10 (effect of morphological refinement).

All three show the same test image of a dataset (`example_index`), so they can be read together.
A prediction is made by the run's network in eval mode on CPU: z = final class-logit map
(1, C, H, W), DP-Morph applied to z as in evaluation (`apply_morph`), label = argmax over C.
Runs come as model.pt paths (which carry the networks' build arguments); their wildcards are
parsed from the path. Runs with adaptive morphology are not shown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from dpmed.config.grid import wildcards_from_path
from dpmed.config.wildcards import parse_eps
from dpmed.data.registry import dataset_label
from dpmed.models import load_model
from dpmed.privacy.clipping import paper_column_order, report_order
from dpmed.report.data import LABEL_COLOURS
from dpmed.report.style import save_figure
from dpmed.seg.data import load_seg_data
from dpmed.seg.grid import SEG_DATASETS, is_shown_cell
from dpmed.seg.losses import split_output
from dpmed.seg.morph_ops import apply_morph
from dpmed.seg.morphology import MorphSpec, morph_kind, parse_morph
from dpmed.seg.report.labels import clip_label, model_label, model_order

# Improved map (Fig. 10): 0 correct before and after, 1 wrong before and after, 2 corrected
# by morphology, 3 new error introduced by morphology.
IMPROVED_CMAP = ListedColormap(["#000000", "#808080", "#00ffff", "#ff0000"])


def visual_clips() -> tuple[str, ...]:
    """Fig. 6's columns: the non-private baseline, then the private rules in the paper's
    column order."""
    return paper_column_order(baseline_first=True)


def example_index(masks: np.ndarray) -> int:
    """The image of `masks` (N, H, W) with the most foreground classes, then the most
    foreground pixels; ties go to the lowest index."""
    n = len(masks)
    if n == 0:
        raise ValueError("no images to choose an example from")
    classes = [len(np.setdiff1d(np.unique(m), [0])) for m in masks]
    pixels = (masks.reshape(n, -1) > 0).sum(axis=1)
    return min(range(n), key=lambda i: (-classes[i], -int(pixels[i]), i))


@dataclass(frozen=True)
class Example:
    """The example test image of a seg dataset: `input` (1, 1, H, W) for the networks, `image`
    (H, W) in [0, 1], `mask` (H, W) labels, `index` in the test split, class names."""

    dataset: str
    index: int
    input: torch.Tensor
    mask: np.ndarray
    class_names: dict[int, str]

    @property
    def image(self) -> np.ndarray:
        return self.input[0, 0].numpy()

    @property
    def n_classes(self) -> int:
        return len(self.class_names)


def load_example(processed_dir: str | Path, dataset: str) -> Example:
    """The `example_index` image of the test split of `processed_dir`."""
    test = load_seg_data(processed_dir, dataset).splits["test"]
    classes = json.loads((Path(processed_dir) / "meta.json").read_text())["classes"]
    i = example_index(test.masks.numpy())
    return Example(
        dataset,
        i,
        test.images[i : i + 1],
        test.masks[i].numpy(),
        {int(k): v for k, v in classes.items()},
    )


def _class_cmap(n_classes: int) -> ListedColormap:
    """Background black, class c ≥ 1 the (c−1)-th label colour of the data overview."""
    return ListedColormap(["#000000"] + LABEL_COLOURS[: n_classes - 1])


def _show_image(ax: plt.Axes, image: np.ndarray) -> None:
    ax.imshow(image, cmap="gray", vmin=0, vmax=1, interpolation="nearest")


def _show_mask(ax: plt.Axes, mask: np.ndarray, n_classes: int) -> None:
    ax.imshow(
        mask,
        cmap=_class_cmap(n_classes),
        vmin=-0.5,
        vmax=n_classes - 0.5,
        interpolation="nearest",
    )


def _class_legend(ax: plt.Axes, class_names: Mapping[int, str], **placement: Any) -> None:
    """The legend of the class colours on `ax`, placed by `placement` (legend keywords)."""
    cmap = _class_cmap(len(class_names))
    handles = [
        Patch(color=cmap(c), label=f"{c}: {name}") for c, name in sorted(class_names.items())
    ]
    ax.legend(handles=handles, fontsize=6, frameon=False, **placement)


def _clear(ax: plt.Axes) -> None:
    ax.set_xticks([])
    ax.set_yticks([])


def examples_figure(processed_dirs: Mapping[str, str | Path], png_path: str | Path) -> None:
    """Fig. 1: per seg dataset (columns) the example test image and its colour-coded mask."""
    datasets = [d for d in SEG_DATASETS if d in processed_dirs]
    if not datasets:
        raise ValueError(
            f"no seg dataset among {sorted(processed_dirs)} (need {list(SEG_DATASETS)})"
        )
    fig, axes = plt.subplots(2, len(datasets), figsize=(2.8 * len(datasets), 6.4), squeeze=False)
    for col, dataset in enumerate(datasets):
        ex = load_example(processed_dirs[dataset], dataset)
        top, bottom = axes[0, col], axes[1, col]
        _show_image(top, ex.image)
        top.set_title(
            f"({chr(ord('a') + col)}) {dataset_label(dataset)}: test image {ex.index}", fontsize=8
        )
        _show_mask(bottom, ex.mask, ex.n_classes)
        _class_legend(
            bottom, ex.class_names, loc="upper center", bbox_to_anchor=(0.5, -0.03), ncol=2
        )
        for ax in (top, bottom):
            _clear(ax)
    axes[0, 0].set_ylabel("input")
    axes[1, 0].set_ylabel("ground truth")
    fig.suptitle("Segmentation datasets: example input and ground-truth mask", fontsize=10)
    save_figure(fig, png_path)


def run_table(model_paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per run: its wildcards (eps as float, seed as int) and folder."""
    rows = []
    for path in model_paths:
        run_dir = Path(path).parent.as_posix()
        wc = wildcards_from_path("seg", run_dir)
        rows.append(
            {**wc, "eps": parse_eps(wc["eps"]), "seed": int(wc["seed"]), "run_dir": run_dir}
        )
    columns = ["dataset", "model", "clip", "morph", "eps", "seed", "run_dir"]
    return pd.DataFrame(rows, columns=columns)


def _usable(runs: pd.DataFrame, datasets: Iterable[str]) -> pd.DataFrame:
    """Runs of `datasets` in cells the paper's qualitative figures show (`is_shown_cell`)."""
    shown = [is_shown_cell(wc) for wc in runs.to_dict("records")]
    return runs[runs["dataset"].isin(list(datasets)) & np.array(shown, dtype=bool)]


def _first_run(cell: pd.DataFrame) -> pd.Series:
    """The run of a cell with the largest ε, then the lowest seed."""
    return cell.sort_values(["eps", "seed"], ascending=[False, True]).iloc[0]


def select_visual_runs(runs: pd.DataFrame, datasets: Iterable[str]) -> pd.DataFrame:
    """Fig. 6's runs: per dataset one model (most clip rules present; ties in the order UNet++,
    UNet, LFUNet, Inf-Net), one morphology (covering most of its rules; fixed before none, then
    by name) and per clip rule of `visual_clips()` the run with the largest ε, lowest seed."""
    usable = _usable(runs, datasets)
    models, clips = model_order(), visual_clips()
    chosen = []
    for dataset in SEG_DATASETS:
        sub = usable[usable["dataset"] == dataset]
        if sub.empty:
            continue
        n_clips = sub.groupby("model")["clip"].nunique()
        model = min(n_clips.index, key=lambda m: (-n_clips[m], models.index(m)))
        sub = sub[sub["model"] == model]
        cover = sub.groupby("morph")["clip"].nunique()
        morph = min(cover.index, key=lambda m: (-cover[m], morph_kind(m) != "fixed", m))
        sub = sub[sub["morph"] == morph]
        chosen += [_first_run(sub[sub["clip"] == c]) for c in clips if c in set(sub["clip"])]
    return pd.DataFrame(chosen, columns=runs.columns).reset_index(drop=True)


def select_morph_runs(runs: pd.DataFrame, datasets: Iterable[str]) -> pd.DataFrame:
    """Fig. 10's runs: per dataset one run with a fixed morphology, non-private first, else
    the first clip rule in report order; then model order, morphology name, largest ε,
    lowest seed."""
    usable = _usable(runs, datasets)
    fixed = usable[usable["morph"].map(morph_kind) == "fixed"]
    models, clips = model_order(), report_order()
    chosen = []
    for dataset in SEG_DATASETS:
        sub = fixed[fixed["dataset"] == dataset]
        if sub.empty:
            continue
        order = sub.assign(
            _clip=sub["clip"].map(clips.index), _model=sub["model"].map(models.index)
        ).sort_values(
            ["_clip", "_model", "morph", "eps", "seed"], ascending=[True, True, True, False, True]
        )
        chosen.append(order.iloc[0][runs.columns])
    return pd.DataFrame(chosen, columns=runs.columns).reset_index(drop=True)


def raw_logits(run: pd.Series, image: torch.Tensor) -> torch.Tensor:
    """The final class-logit map (C, H, W) of `run`'s network on `image` (1, 1, H, W)."""
    net = load_model(Path(run["run_dir"]) / "model.pt")
    with torch.no_grad():
        maps, _ = split_output(net(image))
    return maps[0][0]


def morphed_labels(raw: torch.Tensor, spec: MorphSpec) -> np.ndarray:
    """argmax over classes of the DP-Morph-transformed logits (C, H, W) → (H, W)."""
    return apply_morph(spec, raw[None])[0][0].argmax(dim=0).numpy()


def morph_effect_maps(
    raw: torch.Tensor, spec: MorphSpec, gt: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fig. 10's maps from raw logits (C, H, W) and the ground truth (H, W): labels before
    (argmax of `raw`) and after morphology, corrected = wrong before ∧ right after,
    new_errors = right before ∧ wrong after (boolean (H, W))."""
    before = raw.argmax(dim=0).numpy()
    after = morphed_labels(raw, spec)
    right_before, right_after = before == gt, after == gt
    return before, after, ~right_before & right_after, right_before & ~right_after


def _eps_label(eps: float) -> str:
    return "ε=∞" if math.isinf(eps) else f"ε={eps:g}"


def _runs_or_raise(
    model_paths: Iterable[str | Path],
    processed: Mapping[str, str | Path],
    select: Callable[[pd.DataFrame, list[str]], pd.DataFrame],
    what: str,
) -> pd.DataFrame:
    chosen = select(run_table(model_paths), list(processed))
    if chosen.empty:
        raise ValueError(f"no usable seg run for {what} (datasets {sorted(processed)})")
    return chosen


def visual_figure(
    model_paths: Iterable[str | Path], processed: Mapping[str, str | Path], png_path: str | Path
) -> None:
    """Fig. 6: per dataset (rows) input, ground truth and the prediction of each clip rule
    (`select_visual_runs` among the candidates' model.pt files; `processed`: dataset → its
    processed data folder) to `png_path` (+ .pdf); rules without a run are blank panels marked
    "not run"."""
    chosen = _runs_or_raise(model_paths, processed, select_visual_runs, "Fig. 6")
    datasets = list(dict.fromkeys(chosen["dataset"]))
    examples = {d: load_example(processed[d], d) for d in datasets}
    columns = visual_clips()
    ncols = 2 + len(columns)
    fig, axes = plt.subplots(
        len(datasets), ncols, figsize=(1.9 * ncols + 1.6, 2.2 * len(datasets)), squeeze=False
    )
    for row, dataset in enumerate(datasets):
        ex, runs = examples[dataset], chosen[chosen["dataset"] == dataset]
        ax = axes[row]
        _show_image(ax[0], ex.image)
        _show_mask(ax[1], ex.mask, ex.n_classes)
        ax[0].set_title("input", fontsize=8)
        ax[1].set_title(f"ground truth (test {ex.index})", fontsize=8)
        first = runs.iloc[0]
        ax[0].set_ylabel(
            f"{dataset_label(dataset)}\n{model_label(first['model'])}, morph {first['morph']}",
            fontsize=8,
        )
        by_clip = {run["clip"]: run for _, run in runs.iterrows()}
        for col, clip in enumerate(columns, start=2):
            if clip not in by_clip:
                ax[col].text(0.5, 0.5, "not run", ha="center", va="center", fontsize=8)
                ax[col].set_title(clip_label(clip), fontsize=8)
                continue
            run = by_clip[clip]
            pred = morphed_labels(raw_logits(run, ex.input), parse_morph(run["morph"]))
            _show_mask(ax[col], pred, ex.n_classes)
            ax[col].set_title(
                f"{clip_label(clip)} ({_eps_label(run['eps'])}, seed {run['seed']})", fontsize=7
            )
        for a in ax:
            _clear(a)
        _class_legend(ax[-1], ex.class_names, loc="center left", bbox_to_anchor=(1.03, 0.5))
    fig.suptitle("Predictions per clipping rule on one test image per dataset", fontsize=10)
    save_figure(fig, png_path)


def morph_effect_figure(
    model_paths: Iterable[str | Path], processed: Mapping[str, str | Path], png_path: str | Path
) -> None:
    """Fig. 10: per dataset (rows) input, ground truth, prediction before and after the run's
    fixed morphology and the improved map (cyan corrected, red new errors, grey wrong in both,
    black right in both), for the run of `select_morph_runs`. Arguments as `visual_figure`."""
    chosen = _runs_or_raise(model_paths, processed, select_morph_runs, "Fig. 10")
    examples = {d: load_example(processed[d], d) for d in chosen["dataset"]}
    fig, axes = plt.subplots(len(chosen), 5, figsize=(11.5, 2.5 * len(chosen)), squeeze=False)
    for ax, (_, run) in zip(axes, chosen.iterrows(), strict=True):
        ex = examples[run["dataset"]]
        before, after, corrected, new_errors = morph_effect_maps(
            raw_logits(run, ex.input), parse_morph(run["morph"]), ex.mask
        )
        improved = np.where(before == ex.mask, 0, 1)
        improved[corrected], improved[new_errors] = 2, 3
        _show_image(ax[0], ex.image)
        for a, labels in zip(ax[1:4], (ex.mask, before, after), strict=True):
            _show_mask(a, labels, ex.n_classes)
        ax[4].imshow(improved, cmap=IMPROVED_CMAP, vmin=-0.5, vmax=3.5, interpolation="nearest")
        titles = (
            "input",
            f"GT (test {ex.index})",
            "before morphology",
            f"after {run['morph']}",
            f"improved map: {int(corrected.sum())} corrected,\n{int(new_errors.sum())} new errors",
        )
        for a, title in zip(ax, titles, strict=True):
            a.set_title(title, fontsize=8)
            _clear(a)
        ax[0].set_ylabel(
            f"{dataset_label(run['dataset'])}\n{model_label(run['model'])}, "
            f"{clip_label(run['clip'])} ({_eps_label(run['eps'])})",
            fontsize=8,
        )
        _class_legend(
            ax[4], ex.class_names, loc="center left", bbox_to_anchor=(1.03, 0.5),
            title="classes", title_fontsize=6,
        )  # fmt: skip
    states = ("right before and after", "wrong before and after", "corrected", "new error")
    axes[-1, 2].legend(
        handles=[Patch(color=IMPROVED_CMAP(i), label=text) for i, text in enumerate(states)],
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.06),
        ncol=4,
        title="improved map",
        title_fontsize=7,
        frameon=False,
    )
    fig.suptitle("Effect of morphological refinement on the predictions", fontsize=10)
    save_figure(fig, png_path)
