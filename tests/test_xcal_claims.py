"""Paper 001's claims (`dpmed.xcal.claims`) read from hand-written xcal metrics.json files:
pairing by seed at equal ε, methods the claims do not name ignored, the chance floor, the
ablation's pairs against the chosen preset and the measured overhead."""

from __future__ import annotations

import json

import pytest

from dpmed.report.claims import claims_tables
from dpmed.xcal.claims import MAX_OVERHEAD, xcal_observations

CELL = "bloodmnist/resnet18/{method}/iid/c10/eps{eps}"


def _run(root, method: str, seed: int, f1: float, road: float, eps: str = "5",
         dataset: str = "bloodmnist", step: float | None = 0.1) -> str:  # fmt: skip
    cell = CELL.format(method=method, eps=eps).replace("bloodmnist", dataset)
    folder = root / "results" / "xcal" / cell / f"seed{seed}"
    folder.mkdir(parents=True)
    metrics = {"f1": f1, "road": road, "f1_per_eps": None, "road_per_eps": road / 5,
               "step_seconds": step}  # fmt: skip
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return str(folder / "metrics.json")


def test_xcal_claims_pair_methods_by_seed_at_equal_eps(tmp_path):
    paths = []
    for seed, gain in enumerate([0.10, 0.12, 0.11]):
        paths.append(_run(tmp_path, "static", seed, 0.50, 10.0, step=0.10 + seed / 100))
        paths.append(_run(tmp_path, "xcal", seed, 0.50 + gain, 30.0 + seed, step=0.15))
        paths.append(_run(tmp_path, "xcal-logit", seed, 0.55, 20.0 + 2 * seed))
        paths.append(_run(tmp_path, "agp", seed, 0.90, 90.0))  # a method no claim names
        paths.append(_run(tmp_path, "static", seed, 0.50, 10.0, eps="0.5"))  # no xcal at ε 0.5
    paths.append(_run(tmp_path, "xcal", 7, 0.9, 90.0))  # no static seed 7: unpaired
    claims, frame = xcal_observations(paths)
    table, measured = claims_tables({"xcal": (claims, frame)})
    rows = table.set_index("claim")
    f1 = rows.loc["xcal-f1-above-static"]
    cell = "dataset bloodmnist, model resnet18, shift iid, clients 10, eps 5, method xcal"
    assert f1["cell"] == cell
    assert f1["n_seeds"] == 3 and f1["diff_mean"] == pytest.approx(0.11)
    assert f1["verdict"] == "supported"
    assert rows.loc["xcal-f1-efficiency-above-static", "reason"] == (
        "no finite value in the compared runs"
    )
    preset = rows.loc["xcal-chosen-road-above-presets"]
    assert preset["cell"].endswith("method xcal, against logit")
    assert preset["diff_mean"] == pytest.approx(9.0)
    assert rows.loc["xcal-chosen-f1-above-presets-strict", "reason"].startswith("cells absent")
    overhead = measured.set_index("claim").loc["xcal-overhead-within-80pct"]
    assert overhead["arm_mean"] == pytest.approx(0.15 / MAX_OVERHEAD)
    assert overhead["baseline_mean"] == pytest.approx(0.11)


def test_xcal_classifiers_both_at_chance_are_below_the_scale(tmp_path):
    # DermaMNIST has 7 classes: chance floor 1.5 / 7 ≈ 0.21
    paths = [_run(tmp_path, m, s, f1, 5.0 + s * (m == "xcal"), dataset="dermamnist")
             for s in range(3) for m, f1 in (("static", 0.15), ("xcal", 0.20))]  # fmt: skip
    claims, frame = xcal_observations(paths)
    table, _ = claims_tables({"xcal": (claims, frame)})
    road = table.set_index("claim").loc["xcal-road-above-static"]
    assert road["verdict"] == "inconclusive" and road["reason"].startswith("both classifiers")
