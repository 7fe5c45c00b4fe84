"""The demo's measured summary, generated from the run's files (docs/demo.md links it and states
no measured number itself): the demo's target table with `met` / `not met` per row and the
measured value beside its threshold, then the measured tables docs/demo.md describes.

- **Segmentation, the learning cells.** Per dataset, the non-private cell without morphology
  (clip `none`, morph `none`) of the model trained for the most epochs (the first such model in
  grid order on a tie), and every cell of that dataset and model trained as long (other clip
  rules, ε, morphologies and seeds; the short sweep and coverage cells are left out).
- **Membership attack.** AUC per attacked cell; per dataset and model, the mean over its
  non-private cells against the mean over its private ones.
- **Federated classification.** Macro F1 per cell beside chance 1/K and the test-set size (a
  margin over chance of a few images means little), ROAD of the Grad-CAM maps beside random
  maps, and ε spent.
- **Federated segmentation.** Dice in round 0 (the untrained model) and in the last round.

Rows whose cells the grid lacks say `cells absent`, so the paper config (other cells) gets a
summary too. Every value comes from a run file; the file holds no wall-clock time, so it is
byte-identical across runs of one config on one machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.config.wildcards import parse_eps
from dpmed.io import write_text
from dpmed.report.style import to_markdown, write_table

# The demo's targets, as docs/demo.md sets them for `make demo`.
SEG_DICE_TARGET = 0.7  # non-private test Dice of each dataset's learning cell
DP_SHARE_TARGET = 0.6  # flat DP-SGD at the largest ε keeps this share of the non-private Dice
# xcal non-DP macro F1 ≥ (1 + 1/K) / 2 (half-way from chance to 1); DP methods F1 > 1/K;
# attack AUC: mean over non-private attacked cells > mean over private ones.

MET, NOT_MET, ABSENT = "met", "not met", "cells absent"
# the target column of each kind of row
SEG_DICE_ROW = f"non-private seg test Dice >= {SEG_DICE_TARGET}"
FLAT_ROW = f"flat DP-SGD at the largest eps: Dice >= {DP_SHARE_TARGET} x non-private"
ATTACK_ROW = "membership attack AUC: non-private mean > private mean"
XCAL_REFERENCE_ROW = "xcal non-DP macro F1 >= (1 + 1/K) / 2"
XCAL_CHANCE_ROW = "xcal DP method above chance: macro F1 > 1/K"
TARGET_COLUMNS = ["target", "cell", "seeds", "measured", "threshold", "result", "note"]
SEG_KEYS = ["dataset", "model", "clip", "morph", "eps"]
XCAL_KEYS = ["dataset", "model", "method", "shift", "clients", "eps"]


def _read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def _runs(study: str, paths: Iterable[str | Path], read) -> pd.DataFrame:
    """One row per run file: its run folder's wildcards plus what `read(path)` returns."""
    rows = [{**wildcards_from_path(study, path), **read(path)} for path in paths]
    return pd.DataFrame(rows)


def seg_learning_cells(metrics: pd.DataFrame) -> pd.DataFrame:
    """The seg cells that learn (module docstring): every cell of each dataset's learning model
    trained as many epochs as its non-private, no-morphology reference, in input order."""
    if metrics.empty:
        return metrics
    reference = metrics[(metrics["clip"] == "none") & (metrics["morph"] == "none")]
    chosen = []
    for _dataset, cells in reference.groupby("dataset", sort=False):
        best = cells.loc[cells["epochs"].idxmax()]
        chosen.append((best["dataset"], best["model"], best["epochs"]))
    keep = pd.Series(False, index=metrics.index)
    for dataset, model, epochs in chosen:
        keep |= (
            (metrics["dataset"] == dataset)
            & (metrics["model"] == model)
            & (metrics["epochs"] == epochs)
        )  # fmt: skip
    # grouped by dataset in the order the grid first names it
    order = {dataset: i for i, (dataset, _, _) in enumerate(chosen)}
    learning = metrics[keep].assign(_order=metrics["dataset"].map(order))
    return (
        learning.sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)
    )


def _mean(frame: pd.DataFrame, column: str) -> tuple[float, int]:
    return float(frame[column].mean()), len(frame)


def _row(target: str, cell: str, seeds: int, measured: float, threshold: float, met: bool,
         note: str = "") -> dict[str, Any]:  # fmt: skip
    result = MET if met else NOT_MET
    values = [target, cell, seeds, measured, threshold, result, note]
    return dict(zip(TARGET_COLUMNS, values, strict=True))


def _absent(target: str, cell: str, note: str) -> dict[str, Any]:
    nan = float("nan")
    return dict(zip(TARGET_COLUMNS, [target, cell, 0, nan, nan, ABSENT, note], strict=True))


def seg_targets(learning: pd.DataFrame) -> list[dict[str, Any]]:
    """Non-private Dice ≥ SEG_DICE_TARGET per learning cell; flat DP at the largest ε keeps
    DP_SHARE_TARGET of it."""
    dice_target, flat_target = SEG_DICE_ROW, FLAT_ROW
    if learning.empty:
        return [_absent(dice_target, "-", "no non-private seg cell without morphology")]
    rows = []
    for (dataset, model), cells in learning.groupby(["dataset", "model"], sort=False):
        plain = cells[cells["morph"] == "none"]
        reference = plain[plain["clip"] == "none"]
        dice, seeds = _mean(reference, "dice")
        name = f"{dataset} {model} none none eps inf"
        rows.append(_row(dice_target, name, seeds, dice, SEG_DICE_TARGET,
                         dice >= SEG_DICE_TARGET, "mean over seeds"))  # fmt: skip
        flat = plain[(plain["clip"] == "flat") & (plain["eps"] != "inf")]
        if flat.empty:
            rows.append(_absent(flat_target, f"{dataset} {model}", "no flat DP cell"))
            continue
        largest = max(flat["eps"], key=parse_eps)
        flat_dice, flat_seeds = _mean(flat[flat["eps"] == largest], "dice")
        threshold = DP_SHARE_TARGET * dice
        rows.append(_row(flat_target, f"{dataset} {model} flat none eps {largest}", flat_seeds,
                         flat_dice, threshold, flat_dice >= threshold,
                         f"threshold {DP_SHARE_TARGET} x the non-private mean"))  # fmt: skip
    return rows


def attack_targets(attacks: pd.DataFrame) -> list[dict[str, Any]]:
    """Per dataset and model: mean AUC over the non-private attacked cells > over the private."""
    target = ATTACK_ROW
    if attacks.empty:
        return [_absent(target, "-", "no attacked seg cell")]
    rows = []
    for (dataset, model), cells in attacks.groupby(["dataset", "model"], sort=False):
        public, private = cells[cells["eps"] == "inf"], cells[cells["eps"] != "inf"]
        name = f"{dataset} {model}"
        if public.empty or private.empty:
            rows.append(_absent(target, name, "needs attacked non-private and private cells"))
            continue
        auc, n_public = _mean(public, "auc")
        dp_auc, n_private = _mean(private, "auc")
        note = (f"measured: non-private mean over {n_public} cells; threshold: private mean "
                f"over {n_private} cells")  # fmt: skip
        rows.append(_row(target, name, n_public, auc, dp_auc, auc > dp_auc, note))
    return rows


def xcal_targets(cells: pd.DataFrame) -> list[dict[str, Any]]:
    """Per non-DP reference (dataset, model, shift, clients): macro F1 ≥ (1 + 1/K) / 2; each
    DP method and ε beside it (same dataset, model, shift, clients): macro F1 > 1/K."""
    reference_target, chance_target = XCAL_REFERENCE_ROW, XCAL_CHANCE_ROW
    if cells.empty:
        return [_absent(reference_target, "-", "no xcal cell")]
    rows = []
    group = ["dataset", "model", "shift", "clients"]
    references = cells[cells["eps"] == "inf"]
    if references.empty:
        return [_absent(reference_target, "-", "no non-DP xcal cell")]
    for key, reference in references.groupby(group, sort=False):
        k, n_test = int(reference["classes"].iloc[0]), int(reference["n_test"].iloc[0])
        note = f"K = {k}; {n_test} test images"
        f1, seeds = _mean(reference, "f1")
        threshold = (1 + 1 / k) / 2
        name = " ".join(str(v) for v in key)
        rows.append(_row(reference_target, f"{name} nondp", seeds, f1, threshold,
                         f1 >= threshold, note))  # fmt: skip
        beside = cells[(cells[group] == pd.Series(key, index=group)).all(axis=1)]
        private = beside[beside["eps"] != "inf"]
        if private.empty:
            rows.append(_absent(chance_target, name, "no DP cell beside the non-DP reference"))
        for (method, eps), runs in private.groupby(["method", "eps"], sort=False):
            dp_f1, dp_seeds = _mean(runs, "f1")
            rows.append(_row(chance_target, f"{name} {method} eps {eps}", dp_seeds, dp_f1,
                             1 / k, dp_f1 > 1 / k, note))  # fmt: skip
    return rows


def _seeded(frame: pd.DataFrame, keys: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """`frame`'s keys, seed and `columns`, in input order (an empty frame keeps the header)."""
    names = [*keys, "seed", *columns]
    return frame[names].reset_index(drop=True) if not frame.empty else pd.DataFrame(columns=names)


def _fets_row(path: str | Path) -> dict[str, Any]:
    rounds = pd.read_csv(path)
    first, last = rounds.iloc[0], rounds.iloc[-1]
    row: dict[str, Any] = {"rounds": int(last["round"])}
    for column in ("dice_WT", "dice_mean_labels"):
        row[f"{column} round 0"] = float(first[column])
        row[f"{column} last"] = float(last[column])
        row[f"{column} gain"] = float(last[column] - first[column])
    return row


def _xcal_row(path: str | Path, meta: Mapping[str, dict]) -> dict[str, Any]:
    metrics = _read_json(path)
    spent = float("nan" if metrics["epsilon"] is None else metrics["epsilon"])
    info = meta[wildcards_from_path("xcal", path)["dataset"]]
    test = [
        c["count"] for c in info["counts"]
        if (c["split"], c["class_name"], c["unit"]) == ("test", "all", "images")
    ]  # fmt: skip
    return {
        "f1": metrics["f1"], "classes": int(info["n_classes"]), "chance": 1 / info["n_classes"],
        "n_test": test[0] if test else float("nan"), "road": metrics["road"],
        "road_random": metrics["road_random"], "eps_spent": spent,
    }  # fmt: skip


def demo_summary(inputs: Mapping[str, Sequence[str | Path]]) -> tuple[pd.DataFrame, str]:
    """The target table and the whole summary as Markdown, from the files of `summary_inputs`
    (keys absent or empty: that part's cells are absent)."""
    seg = _runs("seg", inputs.get("seg_metrics", []), _read_json)
    attacks = _runs("seg", inputs.get("seg_attacks", []), lambda p: {"auc": _read_json(p)["auc"]})
    fets = _runs("fets", inputs.get("fets_rounds", []), _fets_row)
    meta = {(m := _read_json(p))["dataset"]: m for p in inputs.get("xcal_meta", [])}
    xcal = _runs("xcal", inputs.get("xcal_metrics", []), lambda p: _xcal_row(p, meta))

    learning = seg_learning_cells(seg)
    targets = pd.DataFrame(
        seg_targets(learning) + attack_targets(attacks) + xcal_targets(xcal),
        columns=TARGET_COLUMNS,
    )
    sections = [
        ("Targets", "The demo's targets, each with the measured value beside its threshold "
         "(`cells absent`: this grid lacks the cells).", targets),
        ("Segmentation: the learning cells", "Test Dice of every cell of each dataset's "
         "learning model trained as long as its non-private reference.",
         _seeded(learning, SEG_KEYS, ["epochs", "dice"])),
        ("Membership attack", "AUC of the global-loss attack per attacked cell (0.5: chance).",
         _seeded(attacks, SEG_KEYS, ["auc"])),
        ("Federated classification", "Macro F1 beside chance 1/K and the test-set size; ROAD "
         "(confidence drop in %) of the Grad-CAM maps beside uniform random maps on the same "
         "images; ε spent (largest over clients).",
         _seeded(xcal, XCAL_KEYS, ["f1", "chance", "n_test", "road", "road_random", "eps_spent"])),
        ("Federated segmentation", "Dice of the whole tumour and mean over the labels in round 0 "
         "(the untrained model) and in the last round, and the gain.",
         _seeded(fets, ["aggregator", "dpmode", "eps"], [c for c in fets.columns
                 if c not in ("aggregator", "dpmode", "eps", "seed")])),
    ]  # fmt: skip
    parts = ["# Demo summary\n", "Generated by the rule `demo_summary` from this run's files; "
             "docs/demo.md says what each cell is and what it can and cannot show.\n"]  # fmt: skip
    for title, text, frame in sections:
        table = to_markdown(frame) if not frame.empty else "Cells absent from this grid.\n"
        parts.append(f"## {title}\n\n{text}\n\n{table}")
    return targets, "\n".join(parts)


def write_demo_summary(
    md_path: str | Path, csv_path: str | Path, **inputs: Sequence[str | Path]
) -> None:
    """Write the summary of the named input lists `inputs` (`demo_summary`) to `md_path` and
    its target table to `csv_path` (+ .md, .html)."""
    targets, text = demo_summary(inputs)
    write_text(md_path, text)
    write_table(targets, csv_path)
