"""Paper 001's claims as paired comparisons over seeds (`dpmed.report.claims`), read by name
from the xcal runs' metrics.json: macro-F1, ROAD (the MoRF confidence drop, %), ΔF1/Δε and
ΔROAD/Δε over the run's trajectory, and (measured, not byte-identical) seconds per local step.

Cells are one dataset, model, shift, client count and ε; the compared runs differ only in the
method (common random numbers: the same partition, initial weights and batches), paired by
seed. XCal-FL is the bare `xcal` method, the paper's chosen (α, β, γ) preset; methods the
claims do not name are ignored. A comparison whose two classifiers are both at chance (macro-F1
below `CHANCE_FACTOR`/K for K classes) is below the claims' scale.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.data.registry import DATASET_REGISTRY
from dpmed.report.claims import Claim, observations, paired
from dpmed.xcal.methods import BASELINE, METHODS, PROPOSED, split_method
from dpmed.xcal.shifts import POOLED

# Uniform guessing scores macro-F1 1/K on balanced classes; the half on top allows for a small
# test set.
CHANCE_FACTOR = 1.5
EQUIVALENT_F1 = 0.05  # "comparable F1" across presets: a twentieth of the F1 scale
MAX_OVERHEAD = 1.8  # §8, App. F: "up to 80 %" over static DP-SGD per step
STRICT_EPS = 5.0  # §7: "relaxed privacy levels ε ≥ 5"; below it strict
CELL = ["dataset", "model", "shift", "clients", "eps"]
CHOSEN = METHODS[PROPOSED].default_preset

_NEEDS = "XCal-FL (preset {0}) and static DP-FL runs of one dataset, model, shift, clients and ε"
_NEEDS_MAIN = _NEEDS.format(CHOSEN)
_NEEDS_PRESETS = f"XCal-FL runs of preset {CHOSEN} and another preset in one cell{{}}"
_MAIN = ("xcal_main", "xcal_trajectories")  # the final metrics and their rounds
_ROAD = "ROAD: MoRF confidence drop (%)"
_STEP = "seconds per local step"
CLAIMS: tuple[Claim, ...] = (
    Claim(
        "xcal-f1-above-static", "paper 001 §6, §10",
        "XCal-FL reaches a higher macro-F1 than static DP-FL at equal ε (over 10 % in the paper)",
        "test macro-F1", "XCal-FL", "static DP-FL", "greater", _NEEDS_MAIN, _MAIN,
    ),
    Claim(
        "xcal-road-above-static", "paper 001 §6, §10",
        "XCal-FL's explanations are more faithful than static DP-FL's at equal ε (ROAD up to "
        "5× in the paper)",
        _ROAD, "XCal-FL", "static DP-FL", "greater", _NEEDS_MAIN, ("xcal_main", "xcal_gradcam"),
    ),
    Claim(
        "xcal-f1-efficiency-above-static", "paper 001 §6",
        "XCal-FL turns each unit of ε into more F1 than static DP-FL (ΔF1/Δε over the run; "
        "rows without a defined slope have no finite value)",
        "ΔF1/Δε", "XCal-FL", "static DP-FL", "greater", _NEEDS_MAIN, ("xcal_efficiency",),
    ),
    Claim(
        "xcal-road-efficiency-above-static", "paper 001 §6",
        "XCal-FL turns each unit of ε into more ROAD than static DP-FL (ΔROAD/Δε, ROAD in %)",
        "ΔROAD/Δε", "XCal-FL", "static DP-FL", "greater", _NEEDS_MAIN, ("xcal_efficiency",),
    ),
    Claim(
        "xcal-chosen-road-above-presets", "paper 001 §7",
        f"The chosen weights ({CHOSEN}, α = β = γ = 1) give higher ROAD than each other "
        "(α, β, γ) preset",
        _ROAD, f"XCal-FL {CHOSEN}", "XCal-FL other preset (cell)", "greater",
        _NEEDS_PRESETS.format(""), ("xcal_ablation",),
    ),
    Claim(
        "xcal-chosen-f1-above-presets-strict", "paper 001 §7",
        f"Under strict privacy (ε < {STRICT_EPS:g}) the chosen weights ({CHOSEN}) give the "
        "highest melanoma (DermaMNIST) F1",
        "test macro-F1", f"XCal-FL {CHOSEN}", "XCal-FL other preset (cell)", "greater",
        _NEEDS_PRESETS.format(f", DermaMNIST, ε < {STRICT_EPS:g}"), ("xcal_ablation",),
    ),
    Claim(
        "xcal-presets-f1-comparable-relaxed", "paper 001 §7",
        f"At ε ≥ {STRICT_EPS:g} every preset reaches a comparable F1 (within ±{EQUIVALENT_F1} "
        f"of the chosen {CHOSEN})",
        "test macro-F1", "XCal-FL other preset (cell)", f"XCal-FL {CHOSEN}", "equivalent",
        _NEEDS_PRESETS.format(f", ε ≥ {STRICT_EPS:g}"), ("xcal_ablation",), margin=EQUIVALENT_F1,
    ),
    Claim(
        "xcal-signal-costs-time", "paper 001 §8, App. F",
        "The explanation signal (two extra forward passes) makes XCal-FL's local step slower "
        "than static DP-SGD's",
        _STEP, "XCal-FL", "static DP-FL", "greater", _NEEDS.format(CHOSEN) + " (IID)",
        ("xcal_runtime",), measured=True,
    ),
    Claim(
        "xcal-overhead-within-80pct", "paper 001 §8, App. F",
        "XCal-FL's overhead per local step over static DP-SGD is at most 80 %",
        _STEP, f"XCal-FL / {MAX_OVERHEAD:g}", "static DP-FL", "less",
        _NEEDS.format(CHOSEN) + " (IID)", ("xcal_runtime",), measured=True,
    ),
)  # fmt: skip

_METRICS = ["f1", "road", "f1_per_eps", "road_per_eps", "step_seconds"]


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _runs(metrics_paths: Sequence[str]) -> pd.DataFrame:
    """One row per run: wildcards, the compared metrics (NaN where undefined), whether its
    classifier is above chance (`learned`)."""
    rows = []
    for path in dict.fromkeys(metrics_paths):
        metrics = json.loads(Path(path).read_text())
        wc = wildcards_from_path("xcal", path)
        chance = CHANCE_FACTOR / DATASET_REGISTRY[wc["dataset"]].n_classes
        values = {m: _number(metrics.get(m)) for m in _METRICS}
        rows.append(wc | values | {"learned": values["f1"] >= chance})
    return pd.DataFrame(rows, columns=[*CELL, "method", "seed", *_METRICS, "learned"])


def _at_chance(values: dict) -> str:
    if values["learned"] or values["learned_base"]:
        return ""
    return f"both classifiers at chance (macro-F1 < {CHANCE_FACTOR:g}/K): below the claim's scale"


def _presets(runs: pd.DataFrame) -> list[dict]:
    """The chosen preset against each other preset of its cells."""
    eps = runs["eps"].astype(float)
    strict = runs[(eps < STRICT_EPS) & (runs["dataset"] == "dermamnist")]
    relaxed = runs[eps >= STRICT_EPS]
    chosen, rows = {"method": PROPOSED}, []
    for method in sorted(set(runs["method"])):
        name, preset = split_method(method)
        if name != PROPOSED or preset == CHOSEN:
            continue
        other, tag = {"method": method}, f"against {preset}"
        for claim, frame, metric, arm, base in (
            ("xcal-chosen-road-above-presets", runs, "road", chosen, other),
            ("xcal-chosen-f1-above-presets-strict", strict, "f1", chosen, other),
            ("xcal-presets-f1-comparable-relaxed", relaxed, "f1", other, chosen),
        ):
            rows += paired(frame, claim, metric, arm, base, CELL, _at_chance, tag)
    return rows


def xcal_observations(metrics_paths: Sequence[str]) -> tuple[tuple[Claim, ...], pd.DataFrame]:
    """The registered claims and their observations from the xcal runs' metrics.json."""
    runs = _runs(metrics_paths)
    private = runs[runs["eps"] != "inf"]
    xcal, static = {"method": PROPOSED}, {"method": BASELINE}
    rows = []
    for claim, metric in (("f1", "f1"), ("road", "road"), ("f1-efficiency", "f1_per_eps"),
                          ("road-efficiency", "road_per_eps")):  # fmt: skip
        rows += paired(private, f"xcal-{claim}-above-static", metric, xcal, static, CELL,
                       _at_chance)  # fmt: skip
    rows += _presets(private)
    timed = private[(private["shift"] == POOLED) & (private["clients"] != "1")]
    steps = paired(timed, "xcal-signal-costs-time", "step_seconds", xcal, static, CELL)
    rows += steps + [
        row | {"claim": "xcal-overhead-within-80pct", "arm": row["arm"] / MAX_OVERHEAD}
        for row in steps
    ]
    return CLAIMS, observations(rows)
