"""Paper 000's claims as paired comparisons over seeds (`dpmed.report.claims`), read from the
fets runs: the final validation Dice per region (ET, TC, WT) and the projected convergence
score after the last round from metrics.json, and (measured, not byte-identical) wall-clock
seconds and peak memory from resources.json.

Cells compare runs of one seed that differ only in aggregator, DP mode or ε0 (common random
numbers: the same initial weights, selection schedule and local batches); only the plain cells
enter (no participation sweep). Each DP-SimAgg comparison has one row per DP mode: `paper`
(Algorithm 1-3 as published, what the paper's claims are about) and `sound` (ours). A Dice or
score comparison whose two arms both stay below `LEARNED_DICE` is below the claims' scale.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.fets.aggregation import DP_MODES
from dpmed.fets.grid import is_swept
from dpmed.report.claims import Claim, below, observations, paired

LEARNED_DICE = 0.1  # below it in both arms, a model has not learned the task
EQUIVALENT_DICE = 0.05  # "closely matching": half the 10-15 points §V reports at ε0 = 1
EQUIVALENT_COST = math.log(1.05)  # §V: time and memory "differ by less than 5 %" (ln ratio)
REGIONS = ("ET", "TC", "WT")
UNLEARNED = f"neither arm learned (final Dice < {LEARNED_DICE}): below the claim's scale"

_DICE = "final validation Dice of the cell's region (last round)"
_SCORE = "projected convergence score after the last round"
_COST = "ln of the run's {what} (a difference of ln 1.05 ≈ 0.049 is 5 %)"
_MODES = "paper- or sound-mode DP-SimAgg"
_TABLE_FIG = ("fets_table2", "fets_fig4_rounds")  # the final Dice and its rounds
CLAIMS: tuple[Claim, ...] = (
    Claim(
        "fets-dp10-matches-simagg-dice", "paper 000 §IV, §V, §VI",
        "DP-SimAgg at ε0 = 10 keeps the Dice of non-private SimAgg in every region (within "
        "±0.05: half the 10-15 point loss §V reports at ε0 = 1)",
        _DICE, "DP-SimAgg ε0 = 10", "SimAgg", "equivalent",
        f"{_MODES} at ε0 = 10 and SimAgg runs", _TABLE_FIG, margin=EQUIVALENT_DICE,
    ),
    Claim(
        "fets-dp10-matches-simagg-score", "paper 000 §IV, Table II",
        "DP-SimAgg at ε0 = 10 keeps the projected convergence score of non-private SimAgg "
        "(within ±0.05)",
        _SCORE, "DP-SimAgg ε0 = 10", "SimAgg", "equivalent",
        f"{_MODES} at ε0 = 10 and SimAgg runs", ("fets_table2",), margin=EQUIVALENT_DICE,
    ),
    Claim(
        "fets-dp10-above-fedavg-dice", "paper 000 §I, §IV (with its prior work)",
        "DP-SimAgg at ε0 = 10 segments better than non-private FedAvg on the non-IID "
        "collaborators (it approaches SimAgg, §IV, which outperforms FedAvg, §I)",
        _DICE, "DP-SimAgg ε0 = 10", "FedAvg", "greater",
        f"{_MODES} at ε0 = 10 and FedAvg runs", _TABLE_FIG,
    ),
    Claim(
        "fets-dp10-above-fedavg-score", "paper 000 §I, §IV (with its prior work)",
        "DP-SimAgg at ε0 = 10 reaches a higher projected convergence score than non-private "
        "FedAvg",
        _SCORE, "DP-SimAgg ε0 = 10", "FedAvg", "greater",
        f"{_MODES} at ε0 = 10 and FedAvg runs", ("fets_table2",),
    ),
    Claim(
        "fets-dp10-above-dp1-dice", "paper 000 §IV",
        "Raising ε0 from 1 to 10 improves DP-SimAgg's Dice in every lesion region",
        _DICE, "DP-SimAgg ε0 = 10", "DP-SimAgg ε0 = 1", "greater",
        f"{_MODES} at ε0 = 1 and 10", _TABLE_FIG,
    ),
    Claim(
        "fets-dp1-below-simagg-dice", "paper 000 §V",
        "At ε0 = 1 the noise lowers DP-SimAgg's Dice below non-private SimAgg's (by 10-15 "
        "points in the paper)",
        _DICE, "DP-SimAgg ε0 = 1", "SimAgg", "less",
        f"{_MODES} at ε0 = 1 and SimAgg runs", _TABLE_FIG,
    ),
    Claim(
        "fets-dp1-learns", "paper 000 §I, §VI",
        "DP-SimAgg at ε0 = 1 still segments meaningfully: its final whole-tumour Dice is above "
        "the initial model's",
        "validation Dice WT", "DP-SimAgg ε0 = 1 after the last round", "its round-0 model",
        "greater", f"{_MODES} at ε0 = 1", ("fets_fig4_rounds",),
    ),
    Claim(
        "fets-simagg-above-fedavg-dice", "paper 000 §I, §V (its prior work)",
        "Non-private SimAgg segments better than FedAvg on the non-IID collaborators",
        _DICE, "SimAgg", "FedAvg", "greater", "SimAgg and FedAvg runs", _TABLE_FIG,
    ),
    Claim(
        "fets-simagg-above-fedavg-score", "paper 000 §I, §V (its prior work)",
        "Non-private SimAgg converges to a higher projected convergence score than FedAvg",
        _SCORE, "SimAgg", "FedAvg", "greater", "SimAgg and FedAvg runs", ("fets_table2",),
    ),
    Claim(
        "fets-dp10-simagg-above-dp-fedavg-dice", "paper 000 §I; untested there (§V)",
        "Similarity weighting keeps its edge under DP: sound DP-SimAgg above DP-FedAvg at "
        "ε0 = 10 (the comparison §V says the paper lacks; DP-FedAvg has only the sound mode)",
        _DICE, "DP-SimAgg ε0 = 10", "DP-FedAvg ε0 = 10", "greater",
        "sound DP-SimAgg and DP-FedAvg runs at ε0 = 10", _TABLE_FIG,
    ),
    Claim(
        "fets-dp10-simagg-above-dp-fedavg-score", "paper 000 §I; untested there (§V)",
        "Sound DP-SimAgg reaches a higher projected convergence score than DP-FedAvg at ε0 = 10",
        _SCORE, "DP-SimAgg ε0 = 10", "DP-FedAvg ε0 = 10", "greater",
        "sound DP-SimAgg and DP-FedAvg runs at ε0 = 10", ("fets_table2",),
    ),
    Claim(
        "fets-dp-time-equals-simagg", "paper 000 §IV, §V",
        "DP-SimAgg trains in the wall-clock time of non-private SimAgg (within 5 %, §V)",
        _COST.format(what="wall-clock seconds"), "DP-SimAgg (mode, ε0)", "SimAgg",
        "equivalent", f"{_MODES} and SimAgg runs", ("fets_resources",),
        margin=EQUIVALENT_COST, measured=True,
    ),
    Claim(
        "fets-dp-memory-equals-simagg", "paper 000 §IV, §V",
        "DP-SimAgg needs the peak memory of non-private SimAgg (within 5 %, §V)",
        _COST.format(what="peak memory (GPU where measured, else host RSS; MB)"),
        "DP-SimAgg (mode, ε0)", "SimAgg", "equivalent", f"{_MODES} and SimAgg runs",
        ("fets_resources",), margin=EQUIVALENT_COST, measured=True,
    ),
)  # fmt: skip

PRIVATE_MODES = tuple(name for name, mode in DP_MODES.items() if mode.private)  # paper, sound
_SIMAGG = {"aggregator": "simagg", "dpmode": "none", "eps": "inf"}
_FEDAVG = {"aggregator": "fedavg", "dpmode": "none", "eps": "inf"}
_COLUMNS = ["aggregator", "dpmode", "eps", "seed"]


def _dp(mode: str, eps: str, aggregator: str = "dp_simagg") -> dict[str, str]:
    return {"aggregator": aggregator, "dpmode": mode, "eps": eps}


def _runs(metrics_paths: Sequence[str], resources_paths: Sequence[str]) -> pd.DataFrame:
    """One row per plain run: wildcards, final Dice per region, convergence score, round-0 WT
    Dice, ln wall-clock seconds, ln peak memory and its meter."""
    resources = {Path(p).parent: json.loads(Path(p).read_text()) for p in resources_paths}
    rows = []
    for path in metrics_paths:
        wc = wildcards_from_path("fets", path)
        if is_swept(wc):
            continue
        metrics = json.loads(Path(path).read_text())
        use = resources.get(Path(path).parent, {})
        gpu = use.get("peak_gpu_mem_mb")
        memory, meter = (gpu, "GPU") if gpu else (use.get("peak_rss_mb"), "host RSS")
        rows.append(
            wc | {f"dice_{r}": float(metrics[f"dice_{r}"]) for r in REGIONS} | {
                "score": float(metrics["convergence_score"]),
                "dice_WT_round0": float(metrics["dice_WT_round0"]),
                "time": math.log(use["wall_clock_s"]) if use else math.nan,
                "memory": math.log(memory) if memory else math.nan, "meter": meter,
            }
        )  # fmt: skip
    columns = [*_COLUMNS, *(f"dice_{r}" for r in REGIONS), "score", "dice_WT_round0", "time",
               "memory", "meter"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def _regions(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` long: one row per run and region, its final Dice in `dice`."""
    return runs.melt(_COLUMNS, [f"dice_{r}" for r in REGIONS], "region", "dice").assign(
        region=lambda f: f["region"].str.removeprefix("dice_")
    )


def _learning(runs: pd.DataFrame) -> list[dict]:
    """ε0 = 1 DP-SimAgg runs: final WT Dice against the round-0 model's, within each run."""
    rows = []
    for run in runs[(runs["aggregator"] == "dp_simagg") & (runs["eps"] == "1")].itertuples():
        cell = f"aggregator dp_simagg, dpmode {run.dpmode}, eps 1"
        rows.append(dict(claim="fets-dp1-learns", cell=cell, seed=int(run.seed),
                         arm=run.dice_WT, baseline=run.dice_WT_round0))  # fmt: skip
    return rows


def fets_observations(
    metrics_paths: Sequence[str], resources_paths: Sequence[str]
) -> tuple[tuple[Claim, ...], pd.DataFrame]:
    """The registered claims and their observations from the fets runs' files."""
    runs = _runs(metrics_paths, resources_paths)
    regions = _regions(runs)
    dice, score = below("dice", LEARNED_DICE, UNLEARNED), below("score", LEARNED_DICE, UNLEARNED)
    rows = []
    for mode in PRIVATE_MODES:
        for claim, arm, base in (
            ("dp10-matches-simagg", _dp(mode, "10"), _SIMAGG),
            ("dp10-above-fedavg", _dp(mode, "10"), _FEDAVG),
            ("dp10-above-dp1", _dp(mode, "10"), _dp(mode, "1")),
            ("dp1-below-simagg", _dp(mode, "1"), _SIMAGG),
        ):
            rows += paired(regions, f"fets-{claim}-dice", "dice", arm, base, ["region"], dice)
        for claim, base in (("dp10-matches-simagg", _SIMAGG), ("dp10-above-fedavg", _FEDAVG)):
            rows += paired(runs, f"fets-{claim}-score", "score", _dp(mode, "10"), base, [], score)
        for eps in ("1", "10"):
            for what in ("time", "memory"):
                cell = ["meter"] if what == "memory" else []
                rows += paired(runs, f"fets-dp-{what}-equals-simagg", what, _dp(mode, eps),
                               _SIMAGG, cell)  # fmt: skip
    rows += _learning(runs)
    for claim, arm, base in (
        ("simagg-above-fedavg", _SIMAGG, _FEDAVG),
        ("dp10-simagg-above-dp-fedavg", _dp("sound", "10"), _dp("sound", "10", "dp_fedavg")),
    ):
        rows += paired(regions, f"fets-{claim}-dice", "dice", arm, base, ["region"], dice)
        rows += paired(runs, f"fets-{claim}-score", "score", arm, base, [], score)
    return CLAIMS, observations(rows)
