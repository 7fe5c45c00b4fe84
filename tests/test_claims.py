"""The claims table (`dpmed.report.claims`) on tiny hand-made observations: p-values against
scipy, Holm's correction by hand, each verdict and reason; and paper 002's observations read
from hand-written run files (`dpmed.seg.claims`)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpmed.report.claims import (
    Claim,
    claim_verdicts,
    claims_tables,
    evaluate,
    evidence_files,
    holm,
    observations,
    paired_t_p,
)
from dpmed.seg.claims import study_observations as seg_observations


def claim(id: str, test: str = "greater", **kw) -> Claim:
    return Claim(id, "paper 0 §1", f"claim {id}", "score", "a", "b", test, "a and b runs",
                 ("table_x",), **kw)  # fmt: skip


def rows(claim_id: str, diffs, baseline=0.5, cell="c", scale="") -> list[dict]:
    return [
        dict(claim=claim_id, cell=cell, seed=s, arm=baseline + d, baseline=baseline, scale=scale)
        for s, d in enumerate(diffs)
    ]


SHOWN = [
    "results/tables/seg_main_duke.html", "results/tables/seg_main_umn.html",
    "results/figures/seg_fig3_duke.png", "results/figures/seg_fig4_umn.png",
    "results/figures/seg_fig7_alignment.png", "results/figures/seg_fig11_adaptive.png",
]  # fmt: skip


def test_evidence_resolves_the_cells_wildcards_and_globs():
    patterns = ("seg_main_{dataset}", "seg_fig[345]_{dataset}")
    cell = "dataset umn, model unet, morph none, eps 8, clip nsgd"
    assert evidence_files(patterns, cell, SHOWN) == [
        "results/tables/seg_main_umn.html", "results/figures/seg_fig4_umn.png",
    ]  # fmt: skip
    # a cell that names no dataset: every dataset's files, never another figure
    assert evidence_files(patterns, "clip nsgd", SHOWN) == [SHOWN[0], SHOWN[1], SHOWN[2], SHOWN[3]]
    assert evidence_files(("seg_fig9_attack",), cell, SHOWN) == []


def test_rows_link_their_evidence_or_say_it_is_missing():
    claims = [claim("shown"), claim("missing")]
    claims = [
        Claim(**{**c.__dict__, "evidence": ev})
        for c, ev in zip(claims, [("seg_main_{dataset}",), ("seg_fig9_attack",)], strict=True)
    ]
    frame = observations(
        rows("shown", [0.1, 0.2, 0.15], cell="dataset duke, clip flat")
        + rows("missing", [0.1, 0.2, 0.15])
    )
    table = evaluate("s", claims, frame, SHOWN).set_index("claim")
    assert table.loc["shown", "evidence"] == "results/tables/seg_main_duke.html"
    assert table.loc["missing", "evidence"] == "not in this run's report: seg_fig9_attack"


def test_holm_by_hand():
    # sorted 0.005 (x4), 0.01 (x3), 0.03 (x2), 0.04 (x1, kept monotone); NaN outside the family
    got = holm([0.01, 0.04, math.nan, 0.03, 0.005])
    want = [0.03, 0.06, math.nan, 0.06, 0.02]
    assert got == pytest.approx(want, nan_ok=True)


@pytest.mark.parametrize("side", ["two-sided", "greater", "less"])
def test_paired_t_p_matches_scipy(side):
    diff = np.array([0.02, 0.05, -0.01, 0.04, 0.03])
    want = stats.ttest_1samp(diff, 0.01, alternative=side).pvalue
    assert paired_t_p(diff, 0.01, side) == pytest.approx(want)
    assert math.isnan(paired_t_p(np.array([0.1]))) and math.isnan(paired_t_p(np.ones(3)))


def test_verdicts_and_reasons():
    claims = [
        claim("up"), claim("down", "less"), claim("flat"), claim("few"), claim("absent"),
        claim("same", "equivalent", margin=0.05), claim("apart", "equivalent", margin=0.01),
        claim("small"), claim("tiny", smallest_effect=0.05),
    ]  # fmt: skip
    frame = observations(
        rows("up", [0.10, 0.12, 0.11, 0.13])  # clearly above: supported
        + rows("down", [0.10, 0.12, 0.11, 0.13])  # claimed below, clearly above: contradicted
        + rows("flat", [0.05, -0.04, 0.02, -0.03])  # spans zero
        + rows("few", [0.10, 0.12])  # below min_seeds
        + rows("same", [0.001, -0.002, 0.002, 0.0, -0.001])  # well within ±0.05
        + rows("apart", [0.30, 0.31, 0.29, 0.30])  # entirely outside ±0.01
        + rows("small", [0.10, 0.12, 0.11], scale="did not learn")
        + rows("tiny", [0.010, 0.011, 0.012, 0.010])  # significant, below the smallest effect
    )
    table = evaluate("s", claims, frame).set_index("claim")
    verdict = table["verdict"].to_dict()
    assert verdict == {
        "up": "supported", "down": "contradicted", "flat": "inconclusive",
        "few": "inconclusive", "absent": "inconclusive", "same": "supported",
        "apart": "contradicted", "small": "inconclusive", "tiny": "inconclusive",
    }  # fmt: skip
    assert "spans zero" in table.loc["flat", "reason"]
    assert table.loc["few", "reason"] == "2 paired seed(s); the claim needs ≥ 3"
    assert table.loc["absent", "reason"] == "cells absent: needs a and b runs"
    assert table.loc["absent", "cell"] == "—" and table.loc["absent", "n_seeds"] == 0
    assert table.loc["small", "reason"] == "3 of 3 pairs dropped: did not learn"
    assert table.loc["tiny", "reason"].startswith("below the smallest effect that matters (0.05)")
    # one family per claim: each claim here has one cell, so its Holm p is its p
    tested = ["up", "down", "flat", "same", "apart"]
    diffs = {c: frame[frame["claim"] == c].eval("arm - baseline").to_numpy() for c in tested}
    p = {c: stats.ttest_1samp(diffs[c], 0).pvalue for c in ("up", "down", "flat")}
    for c, m in (("same", 0.05), ("apart", 0.01)):
        p[c] = max(stats.ttest_1samp(diffs[c], -m, alternative="greater").pvalue,
                   stats.ttest_1samp(diffs[c], m, alternative="less").pvalue)  # fmt: skip
    assert table.loc[tested, "p"].tolist() == pytest.approx([p[c] for c in tested])
    assert table.loc[tested, "p_holm"].tolist() == pytest.approx([p[c] for c in tested])
    outside = 2 * stats.ttest_1samp(diffs["apart"], 0.01, alternative="greater").pvalue
    assert table.loc["apart", "p_outside"] == pytest.approx(outside)
    assert table.loc[["few", "absent", "small"], "p_holm"].isna().all()
    mean, sd = diffs["up"].mean(), diffs["up"].std(ddof=1)
    half = stats.t.ppf(0.975, 3) * sd / 2
    assert table.loc["up", ["diff_mean", "diff_ci_low", "diff_ci_high"]].tolist() == pytest.approx(
        [mean, mean - half, mean + half]
    )


def test_holm_runs_over_the_claims_own_deciding_cells_only():
    """A claim's family is its deciding cells: other claims never change its verdict; a second
    cell of the same claim does, and a context (non-primary) cell does not."""
    signal = [0.05, 0.03, 0.06, 0.02]
    alone = evaluate("s", [claim("x")], observations(rows("x", signal)))
    assert alone.loc[0, "p"] < 0.05 and alone.loc[0, "verdict"] == "supported"
    noise = [0.05, -0.05, 0.04, -0.04]
    others = [claim(f"n{i}") for i in range(3)]
    frame = observations(rows("x", signal) + sum((rows(f"n{i}", noise) for i in range(3)), []))
    x = evaluate("s", [claim("x"), *others], frame).set_index("claim").loc["x"]
    assert x["p_holm"] == pytest.approx(alone.loc[0, "p"]) and x["verdict"] == "supported"
    cells = observations(rows("x", signal, cell="c1") + rows("x", noise, cell="c2")
                         + rows("x", noise, cell="c3"))  # fmt: skip
    every = evaluate("s", [claim("x")], cells).set_index("cell")
    assert every.loc["c1", "p_holm"] == pytest.approx(holm(every["p"].tolist())[0])
    primary = evaluate("s", [claim("x", combine="primary", primary="c1")], cells)
    primary = primary.set_index("cell")
    assert primary.loc["c1", "p_holm"] == pytest.approx(alone.loc[0, "p"])
    assert primary["decides"].tolist() == [True, False, False]


def test_a_claim_combines_its_cells_as_it_says():
    up, flat, down = (
        [0.10, 0.12, 0.11, 0.13],
        [0.05, -0.04, 0.02, -0.03],
        [-0.1, -0.12, -0.11, -0.13],
    )

    def verdict(combine: str, *cells, primary: str = "") -> str:
        frame = observations(sum((rows("x", d, cell=f"c{i}") for i, d in enumerate(cells)), []))
        c = claim("x", combine=combine, primary=primary)
        return claim_verdicts([c], evaluate("s", [c], frame)).loc[0, "verdict"]

    assert verdict("every", up, up) == "supported"
    assert verdict("every", up, flat) == "inconclusive"
    assert verdict("every", up, down) == "contradicted"
    assert verdict("any", up, flat) == "supported"
    assert verdict("any", down, flat) == "inconclusive"
    assert verdict("any", down, down) == "contradicted"
    assert verdict("primary", flat, up, primary="c1") == "supported"
    summary = claim_verdicts([claim("x")], evaluate("s", [claim("x")], observations(
        rows("x", up, cell="c0") + rows("x", [0.02, 0.03, 0.025, 0.02], cell="c1"))))  # fmt: skip
    assert summary.loc[0, "weakest_cell"] == "c1" and summary.loc[0, "cells"] == 2


def test_unlearned_pairs_are_dropped_and_counted_not_voiding_the_row():
    frame = observations(
        rows("x", [0.10, 0.12, 0.11, 0.13]) + rows("x", [0.5], scale="neither arm learned")[:1]
    )
    frame.loc[frame.index[-1], "seed"] = 9
    row = evaluate("s", [claim("x")], frame).loc[0]
    assert row["verdict"] == "supported" and row["n_seeds"] == 4
    assert row["dropped"] == "1 of 5 pairs dropped: neither arm learned"
    assert "1 of 5 pairs dropped" in row["reason"]


def test_measured_claims_go_to_their_own_table_with_their_own_family():
    claims = [claim("t"), claim("m", measured=True)]
    frame = observations(rows("t", [0.1, 0.11, 0.12]) + rows("m", [0.2, 0.21, 0.19]))
    tables = claims_tables({"s": (claims, frame)})
    assert tables.cells["claim"].tolist() == ["t"] and tables.measured_cells["claim"].tolist() == [
        "m"
    ]
    assert tables.claims["claim"].tolist() == ["t"] and tables.measured["claim"].tolist() == ["m"]
    assert tables.measured_cells.loc[0, "p_holm"] == pytest.approx(
        tables.measured_cells.loc[0, "p"]
    )
    # the wall-clock pairs apart: they differ between reruns, the others are byte-identical
    assert tables.pairs["claim"].tolist() == ["t"] * 3 and set(tables.pairs["study"]) == {"s"}
    assert tables.measured_pairs["claim"].tolist() == ["m"] * 3


def test_unregistered_observations_and_margins_are_refused():
    with pytest.raises(ValueError, match="unregistered"):
        evaluate("s", [claim("x")], observations(rows("y", [0.1, 0.2, 0.3])))
    with pytest.raises(ValueError, match="margin"):
        claim("e", "equivalent")
    with pytest.raises(ValueError, match="primary"):
        claim("p", combine="primary")


def _seg_run(root, wc: dict, dice: float, val: float, seconds: float = 10.0) -> str:
    folder = root / "/".join(wc.values())
    folder.mkdir(parents=True)
    metrics = {"wildcards": wc, "dice": dice, "val_dice": val, "train_seconds": seconds,
               "epochs": 2}  # fmt: skip
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return str(folder / "metrics.json")


def test_seg_observations_pair_by_seed_within_a_cell(tmp_path):
    base = dict(dataset="duke", model="unet", clip="flat", morph="none", eps="50")
    paths = []
    for seed, (flat, nsgd) in enumerate([(0.70, 0.60), (0.72, 0.65), (0.71, 0.62)]):
        paths.append(_seg_run(tmp_path, base | {"seed": str(seed)}, flat, flat))
        paths.append(_seg_run(tmp_path, base | {"clip": "nsgd", "seed": str(seed)}, nsgd, nsgd))
    paths.append(_seg_run(tmp_path, base | {"clip": "nsgd", "seed": "9"}, 0.1, 0.1))  # unpaired
    sweep = base | {"clip": "flat-C0.5-lr0.001", "seed": "0"}  # not a paper cell
    paths.append(_seg_run(tmp_path, sweep, 0.9, 0.9))
    # fixed variants on a UNet++ cell: both-k3 has the best validation Dice, so it is the
    # baseline of adaptive-v1 although open-k3 has the better test Dice
    cell = base | {"model": "unetpp", "seed": "0"}
    for morph, test, val in (
        ("both-k3", 0.5, 0.8),
        ("open-k3", 0.7, 0.6),
        ("adaptive-v1", 0.6, 0.6),
    ):
        paths.append(_seg_run(tmp_path, cell | {"morph": morph}, test, val))
    claims, frame = seg_observations(paths, [], [])
    nsgd = frame[frame["claim"] == "seg-nsgd-below-flat"]
    assert nsgd["cell"].unique().tolist() == [
        "dataset duke, model unet, morph none, eps 50, clip nsgd"
    ]
    assert sorted(nsgd["seed"]) == [0, 1, 2]
    assert np.allclose(sorted(nsgd["arm"] - nsgd["baseline"]), [-0.10, -0.09, -0.07])
    adaptive = frame[frame["claim"] == "seg-adaptive-above-best-fixed"]
    assert adaptive[["arm", "baseline"]].values.tolist() == [[0.6, 0.5]]
    table = claims_tables({"seg": (claims, frame)}).cells
    row = table.set_index("claim").loc["seg-nsgd-below-flat"]
    assert row["n_seeds"] == 3 and row["verdict"] in ("supported", "inconclusive")
    assert set(table["claim"]) == {c.id for c in claims if not c.measured}


def test_seg_dice_pairs_below_the_learning_scale_are_inconclusive(tmp_path):
    base = dict(dataset="umn", model="unet", clip="flat", morph="none", eps="50")
    paths = []
    for seed in range(3):
        paths.append(_seg_run(tmp_path, base | {"seed": str(seed)}, 0.02, 0.02))
        paths.append(_seg_run(tmp_path, base | {"clip": "psac", "seed": str(seed)}, 0.01, 0.01))
    claims, frame = seg_observations(paths, [], [])
    table = claims_tables({"seg": (claims, frame)}).cells
    row = table.set_index("claim").loc["seg-psac-worst-umn"]
    assert row["verdict"] == "inconclusive" and "neither arm learned" in row["reason"]
    assert isinstance(table, pd.DataFrame)


def test_the_captions_state_the_constants_the_code_uses():
    """The claims captions quote the test level and the fets cost margin; they follow the
    code's constants, so neither can go stale."""
    from conftest import REPO

    from dpmed.fets.claims import EQUIVALENT_COST
    from dpmed.report.claims import ALPHA
    from dpmed.xcal.claims import MAX_OVERHEAD

    claims = (REPO / "workflow/report/claims.rst").read_text()
    measured = (REPO / "workflow/report/claims_measured.rst").read_text()
    from dpmed.report.power import POWER

    plan = (REPO / "workflow/report/power_plan.rst").read_text()
    running = (REPO / "docs/running.md").read_text()
    assert f"level`` of its test ({ALPHA:g}" in plan
    assert f"{POWER:.0%}".replace("%", " %") + " power at the claim's corrected level, " + (
        f"{ALPHA:g} divided"
    ) in running.replace("\n  ", " ")
    levels = re.findall(r"Holm p < (\d+(?:\.\d+)?)", claims)
    assert len(levels) >= 2 and {float(level) for level in levels} == {ALPHA}
    assert f"at most {ALPHA:.0%}".replace("%", " %") in claims
    assert f"ln {math.exp(EQUIVALENT_COST):g} ≈ {EQUIVALENT_COST:.3f}" in measured
    assert f"divided by {MAX_OVERHEAD:g}" in measured


def test_claims_tables_show_claim_cell_verdict_and_reason_first(tmp_path):
    """A reader sees what holds without scrolling: claims.html, .md and .csv start with the
    claim, the cell, the verdict and its reason."""
    from dpmed.report.style import write_table

    frame = observations(rows("a", [0.1, 0.2, 0.15]) + rows("b", [0.1]))
    tables = claims_tables({"s": ([claim("a"), claim("b")], frame)})
    write_table(tables.cells, tmp_path / "claims.csv", links="evidence")
    first = ["claim", "cell", "verdict", "reason"]
    html = (tmp_path / "claims.html").read_text()
    assert re.findall(r"<th>(.*?)</th>", html)[:4] == first
    header = (tmp_path / "claims.md").read_text().split("\n")[0]
    assert header.strip("| ").split(" | ")[:4] == first
    assert list(pd.read_csv(tmp_path / "claims.csv").columns[:4]) == first


def test_a_deciding_cell_whose_every_pair_is_dropped_is_left_out_and_counted():
    up = [0.10, 0.12, 0.11, 0.13]
    frame = observations(rows("x", up, cell="c0") + rows("x", up, cell="c1", scale="at chance"))
    summary = claim_verdicts([claim("x")], evaluate("s", [claim("x")], frame)).loc[0]
    assert summary["verdict"] == "supported" and summary["cells"] == 1
    assert summary["reason"].endswith("1 deciding cell(s) left out: every pair dropped")
    dropped = observations(rows("x", up, scale="at chance"))
    summary = claim_verdicts([claim("x")], evaluate("s", [claim("x")], dropped)).loc[0]
    assert summary["verdict"] == "inconclusive" and "pairs dropped: at chance" in summary["reason"]


def test_a_claim_without_cells_in_the_grid_says_which_cells_it_needs():
    absent = claim_verdicts([claim("x")], evaluate("s", [claim("x")], observations([])))
    assert absent.loc[0, "reason"] == "cells absent: needs a and b runs"
    scoped = claim("x", combine="primary", primary="c9")
    context = evaluate("s", [scoped], observations(rows("x", [0.1, 0.2, 0.15], cell="c1")))
    assert claim_verdicts([scoped], context).loc[0, "reason"].startswith("cells absent: no cell")
