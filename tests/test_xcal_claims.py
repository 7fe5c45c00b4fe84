"""Paper 001's claims (`dpmed.xcal.claims`) read from hand-written xcal metrics.json files:
pairing by seed at equal ε, the chance floor, the pooled cells that decide "on average" claims,
the ratio sizes (over 10 % F1, over 75 % ROAD), the rescoped preset and non-DP claims and the
measured overhead."""

from __future__ import annotations

import json

import pytest

from dpmed.report.claims import claims_tables
from dpmed.xcal.claims import F1_GAIN, MAX_OVERHEAD, ROAD_GAIN_AGP
from dpmed.xcal.claims import study_observations as xcal_observations

JITTER = (0.0, 0.004, -0.003)


def _run(root, method: str, seed: int, f1: float, road: float, eps: str = "0.5",
         dataset: str = "bloodmnist", step: float | None = 0.1, shift: str = "iid",
         clients: int = 10, model: str = "resnet18") -> str:  # fmt: skip
    cell = f"{dataset}/{model}/{method}/{shift}/c{clients}/eps{eps}"
    folder = root / "results" / "xcal" / cell / f"seed{seed}"
    folder.mkdir(parents=True)
    metrics = {"f1": f1, "road": road, "f1_per_eps": None, "road_per_eps": road / 5,
               "step_seconds": step}  # fmt: skip
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return str(folder / "metrics.json")


def _tables(paths):
    claims, frame = xcal_observations(paths)
    return claims_tables({"xcal": (claims, frame)}), frame


def test_xcal_claims_pair_methods_by_seed_and_decide_on_the_pooled_cell(tmp_path):
    paths = []
    for seed, gain in enumerate([0.10, 0.12, 0.11]):
        for dataset, base in (("bloodmnist", 0.50), ("dermamnist", 0.40)):
            paths.append(_run(tmp_path, "static", seed, base, 10.0, dataset=dataset,
                              step=0.10 + seed / 100))  # fmt: skip
            paths.append(_run(tmp_path, "xcal", seed, base + gain, 30.0 + seed, step=0.15,
                              dataset=dataset))  # fmt: skip
        paths.append(_run(tmp_path, "static", seed, 0.50, 10.0, eps="5"))  # no xcal at ε 5
    paths.append(_run(tmp_path, "xcal", 7, 0.9, 90.0))  # no static seed 7: unpaired
    tables, frame = _tables(paths)
    rows = tables.cells.set_index(["claim", "cell"])
    f1 = rows.loc["xcal-f1-above-static"]
    blood = "dataset bloodmnist, model resnet18, shift iid, clients 10, eps 0.5, method xcal"
    assert f1.loc[blood, "n_seeds"] == 3 and not f1.loc[blood, "decides"]
    # the arm is divided by 1.1: (0.50 + 0.11) / 1.1 − 0.50 on blood cells
    assert f1.loc[blood, "diff_mean"] == pytest.approx(0.61 / F1_GAIN - 0.50)
    pooled = f1.loc["method xcal, mean of 2 cells"]
    assert pooled["decides"] and pooled["n_seeds"] == 3
    assert pooled["diff_mean"] == pytest.approx((0.61 + 0.51) / 2 / F1_GAIN - 0.45)
    assert pooled["arm_mean"] == pytest.approx((0.61 + 0.51) / 2 / F1_GAIN)
    claim = tables.claims.set_index("claim").loc["xcal-f1-above-static"]
    assert claim["cells"] == 1 and claim["verdict"] == "supported"
    road = rows.loc[("xcal-road-above-static", "method xcal, mean of 2 cells")]
    assert road["diff_mean"] == pytest.approx(21.0)
    # the per-cell rows name their runs; the pooled ones do not
    cell = frame[(frame["claim"] == "xcal-f1-above-static") & (frame["cell"] == blood)]
    assert cell["arm_run"].str.endswith("bloodmnist/resnet18/xcal/iid/c10/eps0.5/seed0").any()
    overhead = tables.measured_cells.set_index(["claim", "cell"]).loc[
        ("xcal-overhead-within-80pct", "dataset bloodmnist, model resnet18, method xcal, "
         "mean of 1 cells")]  # fmt: skip
    assert overhead["arm_mean"] == pytest.approx(0.15 / MAX_OVERHEAD)
    assert overhead["baseline_mean"] == pytest.approx(0.11) and overhead["decides"]


def test_xcal_f1_gain_under_ten_percent_contradicts_the_papers_size(tmp_path):
    # XCal-FL 6 % above static: a plain direction test would support it, the ratio does not
    paths = []
    for seed, j in enumerate(JITTER):
        paths.append(_run(tmp_path, "static", seed, 0.50, 10.0))
        paths.append(_run(tmp_path, "xcal", seed, 0.53 + j, 30.0))
    claim = _tables(paths)[0].claims.set_index("claim").loc["xcal-f1-above-static"]
    assert claim["verdict"] == "contradicted"


def test_xcal_against_agp_tests_the_papers_ratios_on_agp_only(tmp_path):
    # F1 20 % above AGP (supported over 10 %), ROAD 1.5× AGP's (contradicts over 75 %);
    # the sound AGP-DP is context
    paths = []
    for seed, j in enumerate(JITTER):
        paths.append(_run(tmp_path, "agp", seed, 0.50, 20.0))
        paths.append(_run(tmp_path, "agp-dp", seed, 0.20, 5.0))
        paths.append(_run(tmp_path, "xcal", seed, 0.60 + j, 30.0 + 10 * j))
    tables, _ = _tables(paths)
    claims = tables.claims.set_index("claim")
    assert claims.loc["xcal-f1-above-agp", "verdict"] == "supported"
    assert claims.loc["xcal-road-above-agp", "verdict"] == "contradicted"
    cells = tables.cells.set_index(["claim", "cell"]).loc["xcal-road-above-agp"]
    decides = cells[cells["decides"].astype(bool)]
    assert list(decides.index) == ["method xcal, against agp, mean of 1 cells"]
    assert decides["diff_mean"].iloc[0] == pytest.approx((30.0 + 0.01 / 3) / ROAD_GAIN_AGP - 20.0)
    assert "method xcal, against agp-dp, mean of 1 cells" in cells.index


def test_xcal_dp_below_nondp_is_decided_on_blood_cells_at_eps_half(tmp_path):
    # on blood cells both DP methods stay below non-DP FL; on DermaMNIST XCal-FL matches it
    # (context only) and centralized training is context
    paths = []
    for seed, j in enumerate(JITTER):
        for dataset in ("bloodmnist", "dermamnist"):
            paths.append(_run(tmp_path, "nondp", seed, 0.80, 50.0, "inf", dataset))
            paths.append(_run(tmp_path, "static", seed, 0.60 + j, 10.0, dataset=dataset))
        paths.append(_run(tmp_path, "xcal", seed, 0.70 + j, 30.0))
        paths.append(_run(tmp_path, "xcal", seed, 0.80 + j, 30.0, dataset="dermamnist"))
        paths.append(_run(tmp_path, "centralized", seed, 0.90, 50.0, "inf", clients=1))
    tables, _ = _tables(paths)
    cells = tables.cells.set_index(["claim", "cell"]).loc["xcal-dp-below-nondp"]
    deciding = sorted(cells.index[cells["decides"].astype(bool)])
    assert deciding == [
        f"dataset bloodmnist, model resnet18, shift iid, clients 10, method {m}, eps 0.5, "
        "against nondp" for m in ("static", "xcal")
    ]  # fmt: skip
    central = ("dataset bloodmnist, model resnet18, shift iid, method xcal, eps 0.5, "
               "clients 10, against centralized")  # fmt: skip
    assert cells.loc[central, "diff_mean"] == pytest.approx(0.70 + 0.001 / 3 - 0.90)
    claim = tables.claims.set_index("claim").loc["xcal-dp-below-nondp"]
    assert claim["verdict"] == "supported" and claim["cells"] == 2


def test_xcal_shift_order_and_client_trend_pool_datasets(tmp_path):
    # XCal-FL's ROAD: IID 40 > label 30 > covariate 28 (the last step below 1 point: not
    # supported); F1 under label shift 0.70 at 3 clients → 0.86 at 50
    paths = []
    for seed, j in enumerate(JITTER):
        for dataset in ("bloodmnist", "dermamnist"):
            for shift, road, k in (("iid", 40.0, 2), ("label", 30.0, 1), ("covariate", 29.5, -1)):
                for clients, f1 in ((3, 0.70), (50, 0.86 + j)):
                    paths.append(_run(tmp_path, "xcal", seed, f1, road + k * j, dataset=dataset,
                                      shift=shift, clients=clients))  # fmt: skip
    tables, _ = _tables(paths)
    cells = tables.cells.set_index(["claim", "cell"])
    order = cells.loc["xcal-road-shift-order"]
    iid = order.loc["method xcal, shift iid, against label, mean of 4 cells"]
    assert iid["decides"] and iid["diff_mean"] == pytest.approx(10.0 + 0.001 / 3)
    assert iid["verdict"] == "supported"
    label = order.loc["method xcal, shift label, against covariate, mean of 4 cells"]
    assert label["verdict"] == "inconclusive" and "smallest effect" in label["reason"]
    claims = tables.claims.set_index("claim")
    assert claims.loc["xcal-road-shift-order", "verdict"] == "inconclusive"
    trend = cells.loc[("xcal-clients-f1-label", "shift label, method xcal, clients 50, "
                       "mean of 2 cells")]  # fmt: skip
    assert trend["diff_mean"] == pytest.approx(0.16 + 0.001 / 3) and trend["decides"]
    assert claims.loc["xcal-clients-f1-label", "verdict"] == "supported"
    assert not cells.loc["xcal-clients-f1-label"].index.str.contains("shift iid").any()


def test_xcal_presets_exclude_chest_xray_from_the_balanced_claim(tmp_path):
    # balanced beats logit and dampened on blood cells; on chest X-ray (2 classes: F1 0.9 is
    # above chance) dampened is best
    paths = []
    for seed, j in enumerate(JITTER):
        for eps in ("0.5", "5"):
            for method, blood, chest, k in (("xcal", 40.0, 20.0, 2), ("xcal-logit", 30.0, 15.0, 1),
                                         ("xcal-dampened", 35.0, 30.0, -1)):  # fmt: skip
                paths.append(_run(tmp_path, method, seed, 0.6, blood + k * j, eps))
                paths.append(_run(tmp_path, method, seed, 0.9, chest + k * j, eps,
                                  dataset="pneumoniamnist"))  # fmt: skip
    tables, _ = _tables(paths)
    cells = tables.cells.set_index(["claim", "cell"])
    chosen = cells.loc["xcal-chosen-road-above-presets"]
    deciding = chosen[chosen["decides"].astype(bool)]
    assert sorted(deciding.index) == [f"method xcal, against {p}, mean of 2 cells"
                                      for p in ("dampened", "logit")]  # fmt: skip
    assert deciding["diff_mean"].tolist() == pytest.approx([5.0 + 0.001, 10.0 + 0.001 / 3])
    chest = ("dataset pneumoniamnist, model resnet18, shift iid, clients 10, eps 5, method xcal, "
             "against dampened")  # fmt: skip
    assert (
        chosen.loc[chest, "diff_mean"] == pytest.approx(-10.0 + 0.001)
        and not chosen.loc[chest, "decides"]
    )
    claims = tables.claims.set_index("claim")
    assert claims.loc["xcal-chosen-road-above-presets", "verdict"] == "supported"
    dampened = cells.loc["xcal-dampened-road-above-presets-chest"]
    assert sorted(dampened[dampened["decides"].astype(bool)].index) == [
        f"method xcal-dampened, against {p}, mean of 2 cells" for p in ("balanced", "logit")
    ]
    assert claims.loc["xcal-dampened-road-above-presets-chest", "verdict"] == "supported"


def test_xcal_classifiers_both_at_chance_are_below_the_scale(tmp_path):
    # DermaMNIST has 7 classes: chance floor 1.5 / 7 ≈ 0.21
    paths = [_run(tmp_path, m, s, f1, 5.0 + s * (m == "xcal"), dataset="dermamnist")
             for s in range(3) for m, f1 in (("static", 0.15), ("xcal", 0.20))]  # fmt: skip
    tables, _ = _tables(paths)
    road = tables.cells.set_index("claim").loc["xcal-road-above-static"]
    assert road["verdict"] == "inconclusive" and "both classifiers" in road["reason"]


def test_xcal_pooled_cell_is_the_mean_over_every_eps_where_the_classifiers_learn(tmp_path):
    """ "On average" at equal ε: the deciding cell pools the cells of every ε; a cell at chance
    (both classifiers below 1.5/K) is left out of the mean."""
    paths = []
    for seed, gain in enumerate([0.10, 0.12, 0.11]):
        for eps, base in (("0.5", 0.50), ("50", 0.60), ("5", 0.05)):  # ε 5: both at chance
            paths.append(_run(tmp_path, "static", seed, base, 10.0, eps=eps))
            paths.append(_run(tmp_path, "xcal", seed, base + gain * (base > 0.1), 30.0, eps=eps))
    tables, _ = _tables(paths)
    f1 = tables.cells.set_index(["claim", "cell"]).loc["xcal-f1-above-static"]
    pooled = f1.loc["method xcal, mean of 2 cells"]
    assert pooled["decides"] and pooled["n_seeds"] == 3
    assert pooled["baseline_mean"] == pytest.approx((0.50 + 0.60) / 2)
