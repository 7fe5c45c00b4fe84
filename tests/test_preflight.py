"""Preflight (`dpmed.preflight`): distinct-cell dedupe, σ for every ε of the paper config,
a sample probe of every model, method and ε, failure reporting, and the cost arithmetic.

The sample probe runs the paper config with `REDUCED` merged on top: on 2 shared cores and
24 GB a paper-size sample takes far longer than `make test` allows (a FeTS step at 64³ with
the 32 M-parameter network alone takes tens of seconds on CPU), so the input sizes, widths,
MedMNIST counts, batch sizes and ROAD subsample are reduced; every model, clip rule, DP-Morph
kind, aggregator, DP mode, method and ε of the paper config is still probed. Calibration at
the paper's own sizes is `test_every_paper_eps_calibrates`.
"""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
import yaml
from conftest import REPO, run_snakemake

from dpmed import job_cost
from dpmed.config.checks import check_config, load_configs
from dpmed.config.wildcards import parse_eps
from dpmed.preflight.report import NO_GPU, cost_frame, cost_points, measured_seconds
from dpmed.preflight.run import (
    distinct_cells,
    main,
    nearest,
    preflight_mode,
    projected,
    sample_cells,
    write_cell,
)
from dpmed.preflight.study import calibrate, probe_key, run_probe, study_rules
from dpmed.privacy import accounting

SCHEMA = REPO / "config" / "schema.yaml"
PAPER = REPO / "config" / "config.yaml"
REDUCED = {
    "device": "cpu",
    "data": {
        "fets": {"synthetic": {"shape": [32, 32, 24]}},
        "duke": {"size": [32, 32]},
        "umn": {"size": [32, 32]},
        "covidct": {"size": [32, 32]},
        **{
            d: {"size": 28, "synthetic": {"counts": [160, 20, 40]}}
            for d in ("bloodmnist", "pneumoniamnist", "dermamnist")
        },
    },  # fmt: skip
    "seg": {"defaults": {"width": 4, "depth": 3, "batch_size": 4}},
    "fets": {"defaults": {"base_filters": 4, "depth": 2, "patch_size": [16, 16, 16]}},
    "xcal": {
        "defaults": {
            "width_scale": 0.25,
            "batch_size": 8,
            "road_subsample": 8,
            "road_percentages": [0.5],
        }
    },  # fmt: skip
}


def _grid(config):
    return check_config(config, SCHEMA)


def _small_config():
    """Paper defaults with a hand-sized seg grid: 2 models × (none, flat) × 2 morphs × 2 ε
    × 2 seeds, plus a lr sweep block."""
    config = load_configs([PAPER])
    del config["audit"]  # its cells name jobs of the paper grid
    config["seg"]["grid"] = [
        {"datasets": ["duke"], "models": ["unet", "unetpp"], "clips": ["none", "flat"],
         "morphs": ["none", "open-k3", "open-k5"], "eps": [200, 50, "inf"], "seeds": [0, 1]},
    ]  # fmt: skip
    return config


def test_dedupe_matches_hand_enumeration():
    grid = _grid(_small_config())
    seg = [c for c in distinct_cells(grid, ["seg"])]
    # By hand: the jobs are (model, clip, morph, eps, seed) minus clip none at finite ε and
    # flat at ε inf: 2 models × (none: 3 morphs × 1 ε + flat: 3 morphs × 2 ε) × 2 seeds = 36.
    # Cells drop seed and ε, and open-k3/open-k5 are one morph kind (fixed): per model
    # (none, none), (none, fixed), (flat, none), (flat, fixed) → 8 cells.
    assert sum(len(c.jobs) for c in seg) == len(grid.jobs("seg")) == 36
    keys = {(c.job.wc["model"], c.job.wc["clip"], c.job.wc["morph"] != "none") for c in seg}
    expected = {(m, c, f) for m in ("unet", "unetpp") for c in ("none", "flat") for f in (0, 1)}
    assert len(seg) == 8 and keys == expected
    flat_fixed = next(c for c in seg if c.job.wc["clip"] == "flat" and c.job.wc["morph"] != "none"
                      and c.job.wc["model"] == "unet")  # fmt: skip
    assert flat_fixed.eps == [50.0, 200.0] and len(flat_fixed.jobs) == 2 * 2 * 2
    # every job in exactly one cell
    ids = [id(j) for c in seg for j in c.jobs]
    assert len(ids) == len(set(ids))


def test_cell_names_are_unique_in_the_paper_grid():
    """Cell names key the cost model's preflight points (a re-probed cell replaces its
    point): the centralized xcal cells at ε = 0.5 and ε = inf once shared a name, and a
    refit kept one of each pair."""
    cells = distinct_cells(_grid(load_configs([PAPER])))
    names = [c.name for c in cells]
    assert len(set(names)) == len(names)


def test_nearest_probed_cell_matches_input_network_then_privacy():
    """A cell the sample skipped is projected from the probed cell that matches it best on
    (dataset, model, architecture, private, DP-Morph kind, clip rule), in that order."""
    seg = distinct_cells(_grid(_small_config()), ["seg"])

    def cell(model, clip, fixed):
        return next(c for c in seg if c.job.wc["model"] == model and c.job.wc["clip"] == clip
                    and (c.job.wc["morph"] != "none") == fixed)  # fmt: skip

    unet_plain, unetpp_flat_fixed = cell("unet", "none", False), cell("unetpp", "flat", True)
    probed = [unet_plain, unetpp_flat_fixed]
    # same model: UNet's flat/fixed cell takes UNet's probe, not the other model's same method
    assert nearest(cell("unet", "flat", True), probed) is unet_plain
    assert nearest(cell("unetpp", "none", False), probed) is unetpp_flat_fixed
    # same model, then private before DP-Morph kind: add a private UNet probe
    unet_flat = cell("unet", "flat", False)
    assert nearest(cell("unet", "flat", True), [unet_plain, unet_flat]) is unet_flat
    assert nearest(cell("unet", "none", True), [unet_plain, unet_flat]) is unet_plain
    # no probe of the model: still the private one for a private cell (not the first probed)
    assert nearest(cell("unetpp", "flat", True), [unet_plain, unet_flat]) is unet_flat
    assert nearest(unet_plain, probed) is unet_plain
    assert nearest(unet_plain, []) is None


def test_sample_projects_every_cell_from_its_nearest_probe():
    """With a sample, the cost table projects every cell of the grid: a skipped cell uses its
    nearest probed cell's seconds (`measured_by`) with its own jobs' step counts."""
    config = _small_config()
    cells = distinct_cells(_grid(config), ["seg"])
    probed = [cells[0]]
    m = {"status": "ok", "device": "cpu", "seconds_per_step": 1.0, "eval_seconds_per_batch": 0.0,
         "attack_seconds_per_batch": 0.0, "attack_batch": 8}  # fmt: skip
    frame = cost_frame(config, projected(cells, probed, [(cells[0], m)]))
    train = frame[(frame["rule"] == "seg_train") & (frame["cell"] != "total")]
    assert list(train["cell"]) == [c.name for c in cells]
    assert (train["measured_by"] == cells[0].name).all()
    total = frame[(frame["rule"] == "seg_train") & (frame["cell"] == "total")].iloc[0]
    # by hand: every job's steps at 1 s each: non-private 50 × ⌈66/8⌉ = 450, private
    # 50 × ⌊66/8⌋ = 400 sampled batches (the evaluation costs 0 s here)
    private = [j for c in cells for j in c.jobs if j.wc["clip"] != "none"]
    public = [j for c in cells for j in c.jobs if j.wc["clip"] == "none"]
    assert total["cpu_hours"] == pytest.approx((len(public) * 450 + len(private) * 400) / 3600)


@pytest.mark.parametrize(("value", "mode"), [(False, "off"), ("false", "off"), (True, "all"),
                                             ("true", "all"), ("sample", "sample")])  # fmt: skip
def test_preflight_mode_reads_config_and_command_line_values(value, mode):
    assert preflight_mode(value) == mode


def test_preflight_config_targets_only_the_preflight(tmp_path):
    """`--config preflight=true` makes the preflight the workflow's only job besides `all`;
    the grid's jobs are not in the DAG."""
    result = run_snakemake("--configfile", str(PAPER), "--config", "preflight=true", "-n",
                           "--quiet", "rules", cwd=tmp_path)  # fmt: skip
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", result.stdout, flags=re.M))
    assert counts == {"preflight": "1", "all": "1", "total": "2"}, result.stdout


def test_sample_covers_every_model_method_and_eps():
    grid = _grid(load_configs([PAPER]))
    cells = distinct_cells(grid)
    sample = sample_cells(cells)
    assert len(sample) < len(cells)
    for study, axes in {"seg": ("model", "clip"), "xcal": ("model", "method"),
                        "fets": ("aggregator", "dpmode")}.items():  # fmt: skip
        jobs = grid.jobs(study)
        covered = [j for c in sample if c.study == study for j in c.jobs]
        for axis in axes:
            names = {j.wc[axis] for j in jobs}
            if axis == "aggregator":
                names = {n.split("-rho")[0] for n in names}
                assert names <= {j.wc[axis].split("-rho")[0] for j in covered}
            else:
                assert names <= {j.wc[axis] for j in covered}, (study, axis)
        assert {j.wc["eps"] for j in jobs} <= {j.wc["eps"] for j in covered}, study


def test_every_paper_eps_calibrates():
    """Every ε of config/config.yaml, for every cell of every study, gets a σ whose accounted
    ε is within the target; seg is re-checked here with the accountant directly."""
    config = load_configs([PAPER])
    grid = _grid(config)
    seen = {study: set() for study in ("seg", "fets", "xcal")}
    for cell in distinct_cells(grid):
        for cal in calibrate(config, cell):
            seen[cell.study].add(cal.eps)
            if math.isinf(cal.eps):
                continue
            assert cal.ok is not False, (cell.name, cal)
            if cell.study == "seg":
                # independent check: q, steps from the note, ε of σ·(1 − 1e-3) exceeds target
                q = float(cal.note.split("q=")[1].split(",")[0])
                steps = int(cal.note.split("steps=")[1].split(",")[0])
                looser = accounting.epsilon([(cal.sigma_min * 0.999, q, steps)], 1e-5)
                assert cal.accounted <= cal.eps < looser
    for study in seen:
        wanted = {parse_eps(j.wc["eps"]) for j in grid.jobs(study)}
        assert seen[study] == wanted


def test_cost_arithmetic_by_hand():
    from dpmed.fets.sizing import partitions

    config = load_configs([PAPER])
    data = config["data"]
    m = {"seconds_per_step": 2.0, "eval_seconds_per_batch": 0.5, "attack_seconds_per_batch": 0.25,
         "round_overhead_seconds": 1.0, "eval_seconds": 3.0, "road_seconds": 7.0,
         "aggregate_seconds": 4.0, "updates": 6, "val_seconds_per_volume": 10.0}  # fmt: skip
    hp = config["seg"]["defaults"] | {"batch_size": 8, "epochs": 50}
    # Duke: 10 subjects split 6/2/2, 11 images each → 66/22/22 images; q = 8/66, ⌊1/q⌋ = 8.
    wc = {"dataset": "duke", "model": "unet", "clip": "flat", "morph": "none", "eps": "200"}
    steps, seconds = measured_seconds("seg_train", data, wc, hp, m)
    assert steps == 50 * 8
    assert seconds == pytest.approx(400 * 2.0 + (51 * 3 + 3) * 0.5)
    # non-private: ⌈66/8⌉ = 9 batches per epoch
    assert measured_seconds("seg_train", data, wc | {"clip": "none", "eps": "inf"}, hp, m)[0] == 450
    # attack: 2·min(66, 44) = 88 images in batches of 8 → 11 batches
    assert measured_seconds("seg_attack", data, wc, hp, m) == (11, pytest.approx(11 * 0.25))
    # xcal: bloodmnist 11959 train images, 10 clients, batch 64 → ⌈1195.9/64⌉ = 19 steps
    xhp = config["xcal"]["defaults"] | {"rounds": 30, "clients_per_round": 10, "local_epochs": 1,
                                        "batch_size": 64, "road_every": 5}  # fmt: skip
    xwc = {"dataset": "bloodmnist", "model": "resnet18", "method": "static", "clients": "10"}
    steps, seconds = measured_seconds("xcal_train", data, xwc, xhp, m)
    assert steps == 30 * 10 * 19
    # ROAD every 5th of 30 rounds (6), plus the random-saliency baseline once at the end
    assert seconds == pytest.approx(5700 * 2.0 + 30 * (10 * 1.0 + 3.0) + (6 + 1) * 7.0)
    # fets: 33 partitions of the real sizes (1251 subjects), val = max(1, round(0.2 n))
    train, val = partitions(data)
    assert sum(train) + sum(val) == 1251 and len(val) == 33
    assert val[0] == 34 and val[3] == 1  # 170 → 34; 6 → 1
    fhp = config["fets"]["defaults"] | {"rounds": 20, "participation": 0.2, "local_epochs": 1,
                                        "patches_per_subject": 1, "batch_size": 1}  # fmt: skip
    steps, seconds = measured_seconds("fets_train", data, {}, fhp, m)
    per = math.ceil(sum(train) / 33)
    assert steps == 20 * 6 * per
    assert seconds == pytest.approx(steps * 2.0 + 20 * 4.0 + 21 * sum(val) * 10.0)
    # an aggregate timed on 3 updates is scaled to the 6 a round holds: 8 s per round
    scaled = measured_seconds("fets_train", data, {}, fhp, m | {"updates": 3})[1]
    assert scaled == pytest.approx(seconds + 20 * 4.0)


def test_cost_frame_totals_and_unknown_gpu():
    config = _small_config()
    cells = distinct_cells(_grid(config), ["seg"])[:2]
    m = {"status": "ok", "device": "cpu", "seconds_per_step": 1.0, "eval_seconds_per_batch": 0.0,
         "attack_seconds_per_batch": 0.0, "attack_batch": 8}  # fmt: skip
    frame = cost_frame(config, [(cells[0], m), (cells[1], {"status": "error", "device": "cpu"})])
    train = frame[(frame["rule"] == "seg_train")]
    total = train[train["cell"] == "total"].iloc[0]
    first = train[train["cell"] == cells[0].name].iloc[0]
    # cell 0 (non-private, no morph): 50 epochs × ⌈66/8⌉ steps × 1 s per job
    assert first["steps_per_job"] == 450
    assert first["cpu_hours"] == pytest.approx(len(cells[0].jobs) * 450 / 3600)
    assert total["cpu_hours"] == pytest.approx(first["cpu_hours"])  # the failed cell is left out
    assert (frame["gpu_hours"] == NO_GPU).all()


def test_cells_without_the_attack_are_not_priced_for_it():
    """A block with `attack: false` runs no seg_attack job: neither the cost table nor the
    preflight rows count one for its cells."""
    from dpmed.preflight.run import cell_rows
    from dpmed.preflight.study import Calibration

    config = _small_config()
    config["seg"]["grid"].append(config["seg"]["grid"][0] | {"models": ["unet"], "seeds": [2],
                                                              "attack": False})  # fmt: skip
    cells = distinct_cells(_grid(config), ["seg"])
    m = {"status": "ok", "device": "cpu", "seconds_per_step": 1.0, "eval_seconds_per_batch": 0.0,
         "attack_seconds_per_batch": 1.0, "attack_batch": 8, "parameters": 1}  # fmt: skip
    frame = cost_frame(config, [(cell, m) for cell in cells])
    jobs = frame[frame["cell"] == "total"].set_index("rule")["jobs"]
    unet = sum(len(c.jobs) for c in cells if c.job.wc["model"] == "unet")
    assert jobs["seg_train"] == sum(len(c.jobs) for c in cells)
    assert jobs["seg_attack"] == jobs["seg_train"] - unet // 3  # seed 2 of each unet cell
    cell = next(c for c in cells if c.job.wc["model"] == "unet")
    cal = [Calibration(e, None, None, None, None) for e in cell.eps]
    rows = cell_rows(config, cell, cal, m | {"peak_rss_mb": 1.0})
    by_rule = {r: sum(row["jobs"] for row in rows if row["rule"] == r)
               for r in study_rules()["seg"]}  # fmt: skip
    assert by_rule == {"seg_train": len(cell.jobs), "seg_attack": len(cell.jobs) * 2 // 3}


def test_preflight_peaks_become_cost_points_of_the_training_rule(tmp_path):
    """Each cell a preflight probed without error gives its training rule one point: the job
    cost model's features of the representative job, the probe's peak and the job's
    projected seconds."""
    config = _small_config()
    cells = distinct_cells(_grid(config), ["seg"])
    measures = {"status": "ok", "peak_rss_mb": 1234.0, "seconds_per_step": 2.0,
                "eval_seconds_per_batch": 0.0}  # fmt: skip
    write_cell(tmp_path / "logs/000/cell.json", config, cells[0], measures)
    write_cell(tmp_path / "logs/001/cell.json", config, cells[1], {"status": "error"})
    (point,) = cost_points(tmp_path)
    assert point["rule"] == "seg_train"
    mem, time = job_cost.features("seg_train", config, cells[0].job.wc, cells[0].job.params)
    assert point["mem"] == mem and point["time"] == time
    # cell 0 is non-private: 50 epochs × ⌈66/8⌉ = 450 steps of 2 s (evaluation at 0 s)
    assert point["measured"] == {"mem": 1234.0, "time": 900.0}
    assert point["source"] == "preflight"


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(content))
    return str(path)


@pytest.mark.slow
def test_sample_preflight_runs_every_model_method_and_eps(tmp_path):
    """The covering sample of the paper config (at `REDUCED` sizes) through the workflow's
    preflight rule (`--config preflight=sample`), then its report."""
    configs = ["--configfile", str(PAPER), _write(tmp_path, "reduced.yaml", REDUCED),
               "--config", "preflight=sample"]  # fmt: skip
    ran = run_snakemake(*configs, "--cores", "2", cwd=tmp_path, check=False)
    log = tmp_path / "logs" / "preflight.log"
    assert ran.returncode == 0, (log.read_text() if log.is_file() else "") + ran.stderr
    run_snakemake(*configs, "--report", "report.html", cwd=tmp_path)
    report = (tmp_path / "report.html").read_text()
    assert all(name in report for name in ("preflight.html", "cost.html", "cost.png"))
    out = tmp_path / "results" / "preflight"
    table = pd.read_csv(out / "preflight.csv")
    assert (table["status"] == "ok").all() and (table["s_per_step"] > 0).all()
    assert (table["peak_rss_mb"] > 100).all() and (table["parameters"] > 0).all()
    private = table[table["eps"] != math.inf]
    assert private["eps_ok"].isin([True, "True"]).sum() > 0
    costs = pd.read_csv(out / "cost.csv")
    assert set(costs.loc[costs["cell"] == "total", "study"]) == {"seg", "fets", "xcal"}
    # the sample projects every cell of the grid, each from a probed one
    grid = _grid(load_configs([PAPER, tmp_path / "reduced.yaml"]))
    assert (costs["cell"] != "total").sum() == sum(
        len(study_rules()[c.study]) for c in distinct_cells(grid)
    )
    assert set(costs["measured_by"].dropna()) <= set(table["cell"])
    assert (out / "cost.png").is_file() and (out / "cost.pdf").is_file()
    assert (out / "cost.md").is_file() and (out / "preflight.html").is_file()
    # Every sampled fets cell has its own server probe, every xcal cell its own steps probe;
    # the parts no method changes ran once: the collaborators' side per network, the
    # evaluation per dataset and network.
    fets, xcal = (table[table["study"] == study] for study in ("fets", "xcal"))
    assert len(list(out.glob("logs/*/server/result.json"))) == fets["cell"].nunique() > 1
    assert len(list(out.glob("logs/*/collaborators/result.json"))) == 1
    sampled = sample_cells(distinct_cells(grid))
    xcal_probes = {probe_key(c) for c in sampled if c.study == "xcal"}
    assert len(list(out.glob("logs/*/steps/result.json"))) == len(xcal_probes) > 1
    evaluations = {tuple(cell.split("/")[1:3]) for cell in xcal["cell"]}  # dataset, model
    assert len(list(out.glob("logs/*/evaluation/result.json"))) == len(evaluations) > 1


def test_failing_cell_is_an_error_and_exits_nonzero(tmp_path):
    """A probe that does not finish (here: a 1 s limit) makes every row of its cell status
    error with the reason, and the command exits 1."""
    config = {
        "device": "cpu",
        "audit": {"cells": []},
        "seg": {"grid": [{"datasets": ["duke"], "models": ["unet"], "clips": ["none"],
                          "morphs": ["none"], "eps": ["inf"], "seeds": [0]}]},
        "fets": {"grid": [{"aggregators": ["fedavg"], "dpmodes": ["none"], "eps": ["inf"],
                           "seeds": [0]}]},
        "xcal": {"grid": [{"datasets": ["pneumoniamnist"], "models": ["resnet18"],
                           "methods": ["nondp"], "shifts": ["iid"], "clients": [3],
                           "eps": ["inf"], "seeds": [0]}]},
        "data": {"fets": {"synthetic": {"shape": [16, 16, 8]}},
                 "pneumoniamnist": {"size": 28, "synthetic": {"counts": [60, 10, 20]}}},
    }  # fmt: skip
    out = tmp_path / "out"
    code = main(["--config", str(PAPER), _write(tmp_path, "one.yaml", config),
                 "--timeout", "1", "--out", str(out)])  # fmt: skip
    table = pd.read_csv(out / "preflight.csv")
    assert code == 1
    assert set(table["study"]) == {"seg", "fets", "xcal"}
    assert (table["status"] == "error").all()
    assert table["message"].str.contains("exceeded 1 s").all()


def test_cells_differing_only_in_scalars_share_one_probe(tmp_path):
    """Private seg clip rules, and xcal cells of other shifts, client counts or XCal-FL
    presets, are one computation with other scalars: the first cell's probe measures them
    all (`measured_by`), and each keeps its own calibrated, checked rows."""
    config = {
        "device": "cpu",
        "audit": {"cells": []},
        "seg": {"defaults": REDUCED["seg"]["defaults"],
                "grid": [{"datasets": ["duke"], "models": ["unet"], "clips": ["flat", "nsgd"],
                          "morphs": ["none"], "eps": [50], "seeds": [0]}]},
        "xcal": {"defaults": REDUCED["xcal"]["defaults"],
                 "grid": [{"datasets": ["pneumoniamnist"], "models": ["resnet18"],
                           "methods": ["xcal", "xcal-logit"], "shifts": ["iid", "label"],
                           "clients": [3, 5], "eps": [5], "seeds": [0]}]},
        "data": {"duke": {"size": [32, 32]},
                 "pneumoniamnist": {"size": 28, "synthetic": {"counts": [120, 20, 40]}}},
    }  # fmt: skip
    out = tmp_path / "out"
    code = main(["--config", str(PAPER), _write(tmp_path, "small.yaml", config), "--studies",
                 "seg", "xcal", "--steps", "2", "--out", str(out)])  # fmt: skip
    table = pd.read_csv(out / "preflight.csv")
    assert code == 0 and (table["status"] == "ok").all(), table["message"].tolist()
    seg, xcal = (table[table["study"] == study] for study in ("seg", "xcal"))
    assert seg["cell"].nunique() == 2 and xcal["cell"].nunique() == 2 * 2 * 2
    # one probe per study; every cell calibrated on its own (other partitions, other σ)
    assert len(list(out.glob("logs/*/cell.json"))) == 2
    assert xcal["sigma_min"].nunique() > 1 and (xcal["eps_accounted"] <= 5).all()
    assert (seg.groupby("rule")["s_per_step"].nunique() == 1).all()
    assert seg["peak_rss_mb"].nunique() == 1 and xcal["peak_rss_mb"].nunique() == 1
    costs = pd.read_csv(out / "cost.csv").query("cell != 'total'")
    for study, frame in costs.groupby("study"):
        assert frame["measured_by"].nunique() == 1, study
        assert frame["measured_by"].iloc[0] == frame["cell"].iloc[0]


def test_probe_exception_is_reported_not_raised(tmp_path):
    """A probe that raises returns status error with the exception, and its peak memory."""
    spec = {"probe": "seg", "study": "seg", "wildcards": {"dataset": "duke"}, "params": {},
            "seed": 0, "device": "cpu", "steps": 2, "config": {"data": {}},
            "data_dir": str(tmp_path), "work_dir": str(tmp_path)}  # fmt: skip
    result = run_probe(spec)
    assert result["status"] == "error"
    assert result["message"].startswith("KeyError") and result["peak_rss_mb"] > 0


def test_peak_over_the_request_fails_training_but_not_the_shared_attack_peak():
    """A training peak above its request (with the 1.2 margin) is an error; the seg attack,
    probed in the same child, is only marked unknown by training's peak."""
    from dpmed.job_cost import request
    from dpmed.preflight.run import FIT_MARGIN, cell_rows
    from dpmed.preflight.study import Calibration

    config = _small_config()
    cell = distinct_cells(_grid(config), ["seg"])[0]
    job = cell.jobs[0]
    train_mb = request("seg_train", config, job.wc, job.params).mem_mb
    attack_mb = request("seg_attack", config, job.wc, job.params).mem_mb
    m = {"status": "ok", "device": "cpu", "seconds_per_step": 1.0, "eval_seconds_per_batch": 0.0,
         "attack_seconds_per_batch": 0.0, "attack_batch": 8, "parameters": 1}  # fmt: skip
    cal = [Calibration(math.inf, None, None, None, None)]
    over = max(train_mb, attack_mb) / FIT_MARGIN + 1
    rows = {r["rule"]: r for r in cell_rows(config, cell, cal, m | {"peak_rss_mb": over})}
    assert rows["seg_train"]["status"] == "error" and "request" in rows["seg_train"]["message"]
    assert rows["seg_attack"]["status"] == "ok" and rows["seg_attack"]["fits_mem"] is None
    under = min(train_mb, attack_mb) / FIT_MARGIN - 1
    rows = {r["rule"]: r for r in cell_rows(config, cell, cal, m | {"peak_rss_mb": under})}
    assert all(r["status"] == "ok" and r["fits_mem"] is True for r in rows.values())


def test_predictions_are_labelled_predicted_and_sit_beside_the_measurement():
    """Every time or memory of the preflight tables that a model predicts says "predicted" and
    names its model (the job-cost model or the preflight's projection); the job-cost model's
    peak is the column right after the probe's measured peak, and equals the model's own."""
    from dpmed.job_cost import features, predict
    from dpmed.preflight.report import labelled
    from dpmed.preflight.run import cell_rows
    from dpmed.preflight.study import Calibration

    config = _small_config()
    cells = distinct_cells(_grid(config), ["seg"])
    m = {"status": "ok", "device": "cpu", "seconds_per_step": 1.0, "eval_seconds_per_batch": 0.0,
         "attack_seconds_per_batch": 0.0, "attack_batch": 8, "parameters": 1,
         "peak_rss_mb": 900.0}  # fmt: skip
    cal = [Calibration(math.inf, None, None, None, None)]
    rows = labelled(pd.DataFrame(cell_rows(config, cells[0], cal, m)))
    costs = labelled(cost_frame(config, projected(cells, [cells[0]], [(cells[0], m)])))
    for frame in (rows, costs):
        model = [c for c in frame.columns if "model" in c or "preflight:" in c]
        assert model and all("predicted" in c for c in model), list(frame.columns)
        for old in ("mem_mb", "runtime_min", "gpu_mb", "projected_min", "hours_per_job",
                    "cpu_hours", "gpu_hours"):  # fmt: skip
            assert old not in frame.columns  # no bare number that reads as measured
    columns = list(rows.columns)
    beside = columns[columns.index("peak_rss_mb") + 1]
    assert "predicted" in beside and "job-cost model" in beside
    train = rows[rows["rule"] == "seg_train"].iloc[0]
    job = cells[0].job
    cost = predict("seg_train", *features("seg_train", config, job.wc, job.params))
    assert train[beside] == pytest.approx(cost.host_mb + cost.compute_mb)
    assert train["peak_rss_mb"] == 900.0
