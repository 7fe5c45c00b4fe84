"""Job requests follow the config: the cost model's arithmetic (margins, retries, site scales,
GPU speed-up), the fitted coefficients cover every measured point, and smoke jobs ask for far
less than paper jobs."""

from __future__ import annotations

import json
import math

import pytest
from conftest import REPO, SMOKE_CONFIG
from snakemake.utils import update_config

from dpmed import job_cost
from dpmed.config.checks import check_config, load_configs
from dpmed.preflight.run import FIT_MARGIN
from dpmed.sizing import sized_rules
from dpmed.studies import STUDIES

SCHEMA = REPO / "config" / "schema.yaml"


def grid_of(smoke: bool, **edits):
    config = load_configs([SMOKE_CONFIG] if smoke else [])
    update_config(config, edits)
    return config, check_config(config, SCHEMA)


def requests(smoke: bool, **edits) -> dict[str, list[job_cost.Request]]:
    """rule → the distinct first-try requests of its jobs in the grid."""
    config, grid = grid_of(smoke, **edits)
    out: dict[str, list[job_cost.Request]] = {}
    for rule, request in job_cost.grid_requests(config, grid):
        out.setdefault(rule, []).append(request)
    return out


@pytest.fixture
def fitted(monkeypatch):
    """Round-number coefficients, so requests can be computed by hand."""
    rules = {
        rule: {"mem": {"const": 500.0, "act_unet": 10.0, "act_unetpp": 30.0, "act_patch": 10.0,
                       "act_volume": 1.0, "act_resnet18": 10.0, "act_private": 0.0,
                       "act_adaptive": 0.0},
               "time": {"const": 6.0, "work_unet": 100.0, "work_unetpp": 300.0, "train": 1.0,
                        "val": 1.0, "aggregate": 1.0, "work_resnet18": 1.0,
                        "road": 1.0, "round_static": 1.0, "count_step": 0.0}}
        for rule in sized_rules()
    }  # fmt: skip
    monkeypatch.setattr(job_cost, "coefficients", lambda: {"rules": rules})
    return rules


def seg_job(model: str = "unet"):
    config, grid = grid_of(True)
    wc = {"dataset": "duke", "model": model, "clip": "flat", "morph": "none", "eps": "10",
          "seed": "0"}  # fmt: skip
    return config, wc, grid.params("seg", wc)


def test_request_is_margin_times_prediction_and_grows_with_each_retry(fitted):
    config, wc, hp = seg_job()
    mem, time = job_cost.features("seg_train", config, wc, hp)
    peak = 500.0 + 10.0 * mem["act_unet"] + mem["host"] + mem["device"]
    seconds = 6.0 + 100.0 * time["work_unet"]
    for attempt in (1, 2, 3):
        got = job_cost.request("seg_train", config, wc, hp, attempt)
        want_mem = max(job_cost.MEM_FLOOR_MB, 1.5 * peak) * 1.5 ** (attempt - 1)
        want_min = (2.0 * seconds / 60 + job_cost.TIME_FLOOR_MIN) * 2.0 ** (attempt - 1)
        assert got == job_cost.Request(math.ceil(want_mem), math.ceil(want_min))


def test_site_scales_and_gpu_settings_change_only_their_rule(fitted):
    config, wc, hp = seg_job()
    base = job_cost.request("seg_train", config, wc, hp)
    config["resources"] = {"gpu_speedup": 4.0, "seg_train": {"mem_scale": 2.0,
                                                             "runtime_scale": 3.0}}  # fmt: skip
    scaled = job_cost.request("seg_train", config, wc, hp)
    mem, time = job_cost.features("seg_train", config, wc, hp)
    seconds = 6.0 + 100.0 * time["work_unet"]
    peak = 500.0 + 10.0 * mem["act_unet"] + mem["host"] + mem["device"]
    assert base.mem_mb == math.ceil(max(job_cost.MEM_FLOOR_MB, 1.5 * peak))
    assert scaled.mem_mb == math.ceil(2 * max(job_cost.MEM_FLOOR_MB, 1.5 * peak))
    assert scaled.runtime == math.ceil(3 * (2 * seconds / 60 + job_cost.TIME_FLOOR_MIN))
    on_gpu = job_cost.request("seg_train", config, wc, hp, gpu=True)
    assert on_gpu.runtime == math.ceil(3 * (2 * seconds / 4.0 / 60 + job_cost.TIME_FLOOR_MIN))
    # On a GPU, activations and gradients live on the device: the host asks for the rest.
    host = 500.0 + mem["host"] + job_cost.CUDA_HOST_MB
    assert on_gpu.mem_mb == math.ceil(2 * max(job_cost.MEM_FLOOR_MB, 1.5 * host))
    config["resources"]["max_runtime"] = 7
    assert job_cost.request("seg_train", config, wc, hp, attempt=3).runtime == 7
    assert job_cost.request("seg_attack", config, wc, hp) != scaled  # other rules untouched


def test_retries_never_ask_for_more_memory_than_the_largest_node(fitted):
    config, wc, hp = seg_job()
    wanted = [job_cost.request("seg_train", config, wc, hp, n).mem_mb for n in (1, 2, 3)]
    config["resources"]["max_mem_mb"] = cap = wanted[1] - 1  # binds from the first retry on
    capped = [job_cost.request("seg_train", config, wc, hp, n) for n in (1, 2, 3)]
    assert [r.mem_mb for r in capped] == [wanted[0], cap, cap]
    assert [r.uncapped_mem_mb for r in capped] == [0, wanted[1], wanted[2]]
    assert job_cost.mem_cap_note("seg_train", wc, 1, capped[0]) == ""
    note = job_cost.mem_cap_note("seg_train", wc, 3, capped[2])
    assert f"attempt 3: asks for {cap} MB" in note and f"instead of {wanted[2]} MB" in note
    assert "model=unet" in note and "resources.max_mem_mb" in note


def test_a_model_without_a_fitted_coefficient_is_priced_as_the_dearest(fitted):
    config, wc, hp = seg_job("lfunet")
    mem, time = job_cost.features("seg_train", config, wc, hp)
    assert "act_lfunet" in mem and "act_lfunet" not in fitted["seg_train"]["mem"]
    cost = job_cost.predict("seg_train", mem, time)
    assert cost.host_mb == pytest.approx(500.0 + mem["host"])
    assert cost.compute_mb == pytest.approx(30.0 * mem["act_lfunet"] + mem["device"])
    assert cost.seconds == pytest.approx(6.0 + 300.0 * time["work_lfunet"])


def test_private_jobs_count_per_sample_gradients():
    from dpmed.models import parameter_count

    config, wc, hp = seg_job()
    private, _ = job_cost.features("seg_train", config, wc, hp)
    public, _ = job_cost.features("seg_train", config, {**wc, "clip": "none"}, hp)
    params = parameter_count("unet", in_channels=1, n_classes=9, width=hp["width"],
                             depth=hp["depth"])  # fmt: skip
    per_sample = 2 * hp["batch_size"] * params * 4 / 1e6
    assert private["device"] - public["device"] == pytest.approx(per_sample)
    assert private["host"] == public["host"]


def test_the_fit_covers_every_measured_peak_within_its_margin():
    """The committed fit predicts every measured peak or more (an upper envelope), so each
    job's request is at least `MEM_MARGIN` × its measured peak: more than the preflight's own
    headroom (`FIT_MARGIN`), with room left for a rerun's higher peak (a least-squares fit left
    paper-size points at 1.19× their request's share, and a rerun failed the check). The points
    hold the paper-size probes and the demo's own jobs."""
    assert job_cost.MEM_MARGIN > FIT_MARGIN
    points = _bench_job_cost().read_points()
    assert {"preflight", "run"} <= {p["source"] for p in points}
    for point in (p for p in points if "mem" in p["measured"]):
        cost = job_cost.predict(point["rule"], point["mem"], point["time"])
        predicted = cost.host_mb + cost.compute_mb
        assert point["measured"]["mem"] <= predicted * (1 + 1e-6), point


@pytest.mark.slow
def test_demo_jobs_are_predicted_within_a_small_factor(smoke_run):
    """Every training job of the demo (results/measured/job_cost.csv: its Snakemake benchmark
    beside the model's prediction) is predicted at most 3 × its wall time and at least a third
    of what it took: its wall time, or its CPU time where that was sampled and is less (a job
    that waited for a core of a shared machine). Its peak is covered by `MEM_MARGIN` × the
    predicted peak. The fit led by paper-size points predicted these jobs of seconds at up to
    minutes (xcal's at a tenth) and their peaks below the measured ones."""
    import pandas as pd

    from dpmed.config.grid import wildcards_from_path

    frame = pd.read_csv(smoke_run / "results/measured/job_cost.csv")
    assert set(frame["rule"]) == {"seg_train", "fets_train", "xcal_train"}
    model = job_cost.MODEL
    for _, row in frame.iterrows():
        study = sized_rules()[row["rule"]]
        wc = wildcards_from_path(study, row["run"])
        tsv = smoke_run / STUDIES[study].log(row["rule"], "tsv").format(**wc)
        header, values = tsv.read_text().splitlines()[:2]
        measured = dict(zip(header.split("\t"), values.split("\t"), strict=True))
        wall, cpu = float(measured["s"]), float(measured["cpu_time"])
        assert wall == row["wall_s measured (Snakemake benchmark)"]
        took = min(wall, cpu) if cpu > 0 else wall  # (0: not sampled, a job under the interval)
        predicted = row[f"wall_s predicted ({model})"]
        assert took / 3 <= predicted <= 3 * wall, (row["run"], predicted, wall, cpu)
        peak = row["peak_rss_mb measured (Snakemake benchmark max_rss)"]
        assert job_cost.MEM_MARGIN * row[f"peak_rss_mb predicted ({model})"] >= peak, row["run"]


@pytest.mark.parametrize("seed", range(5))
def test_memory_fit_is_the_least_upper_envelope_and_time_a_least_squares_fit(seed):
    """`fit` on random points: memory predictions are at or above every measure (known terms
    included) and the envelope is tight (shrunk by 1 % some point is above it); time is the
    unconstrained least-squares fit, which has points on both sides."""
    import numpy as np

    bench = _bench_job_cost()
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(30):
        mem = {"const": 1.0, "act_unet": rng.uniform(0, 50), "host": rng.uniform(0, 20)}
        time = {"const": 1.0, "work_unet": rng.uniform(0, 50)}
        measured = {"mem": 100 + 3 * mem["act_unet"] + mem["host"] + rng.normal(0, 15),
                    "time": 10 + 2 * time["work_unet"] + rng.normal(0, 5)}  # fmt: skip
        rows.append({"mem": mem, "time": time, "measured": measured})
    mem_coef, time_coef = bench.fit(rows, "mem"), bench.fit(rows, "time")
    assert min(mem_coef.values()) >= 0 and min(time_coef.values()) >= 0
    assert "host" not in mem_coef  # a known term: its size is exact, not fitted

    def predicted(row, coef, kind):
        return sum(coef.get(n, 1.0 if n == "host" else 0.0) * v for n, v in row[kind].items())

    mem_excess = [predicted(r, mem_coef, "mem") - r["measured"]["mem"] for r in rows]
    assert min(mem_excess) >= -1e-6
    shrunk = {n: 0.99 * v for n, v in mem_coef.items()}
    assert any(predicted(r, shrunk, "mem") < r["measured"]["mem"] for r in rows)
    time_residual = [predicted(r, time_coef, "time") - r["measured"]["time"] for r in rows]
    assert min(time_residual) < 0 < max(time_residual)


def test_smoke_jobs_fit_a_small_node_and_ask_less_than_paper_jobs():
    smoke = requests(True, device="auto")  # as on a cluster: GPU rules ask for a GPU
    paper = requests(False)
    for rule in sized_rules():
        small, large = smoke[rule], paper[rule]
        assert max(r.mem_mb for r in small) <= 16000, rule  # a 22 GB test node takes them
        assert max(r.mem_mb for r in small) < max(r.mem_mb for r in large), rule
        # (the attack's time is the 10-minute floor at both scales)
        assert max(r.runtime for r in small) <= max(r.runtime for r in large), rule
        assert max(r.gpu_mb for r in small) < max(r.gpu_mb for r in large), rule


def _bench_job_cost():
    """bench/job_cost.py as a module (bench scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_job_cost", REPO / "bench/job_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_refit_with_one_reprobed_cell_keeps_the_other_preflight_points(monkeypatch, tmp_path):
    """A preflight of one cell replaces that cell's point only: refitting from a small re-probe
    must not drop the paper-size points of the cells it did not probe. The model goes to
    `--out`, its points beside it; the committed ones are untouched."""
    bench = _bench_job_cost()
    saved = bench.read_points()
    reprobed = next(p for p in saved if p["source"] == "preflight")
    again = dict(reprobed, measured={"mem": 2 * reprobed["measured"]["mem"], "time": 60.0})
    monkeypatch.setattr(bench, "cost_points", lambda _folder: [again])
    committed = bench.POINTS_FILE.read_text(), job_cost.COEFFICIENTS_FILE.read_text()
    bench.main(["--preflight", str(tmp_path), "--out", str(tmp_path / "model.json")])
    assert (bench.POINTS_FILE.read_text(), job_cost.COEFFICIENTS_FILE.read_text()) == committed
    refitted = bench.read_points(tmp_path / "model_points.jsonl")
    assert len(refitted) == len(saved)
    assert [p["measured"] for p in refitted if bench.key(p) == bench.key(again)] == [
        again["measured"]
    ]
    model = json.loads((tmp_path / "model.json").read_text())
    cost = job_cost.predict(again["rule"], again["mem"], again["time"], model)
    assert cost.host_mb + cost.compute_mb >= again["measured"]["mem"] * (1 - 1e-6)


SIZING_LAYER = ("src/dpmed/job_cost.py", "src/dpmed/sizing.py", "src/dpmed/preflight/report.py",
                "src/dpmed/preflight/run.py")  # fmt: skip


def test_the_sizing_layer_imports_no_study_package():
    """job_cost and the preflight's run and report reach a study's sizing only
    through the study registry (`dpmed.<study>.sizing`), never by importing `dpmed.seg`,
    `dpmed.fets` or `dpmed.xcal`, not even inside a function."""
    import ast

    packages = {f"dpmed.{study}" for study in STUDIES}
    found = []
    for path in SIZING_LAYER:
        for node in ast.walk(ast.parse((REPO / path).read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [(path, n) for n in names if n.split(".")[:2] and
                      ".".join(n.split(".")[:2]) in packages]  # fmt: skip
    assert found == []


def test_a_dataset_registered_once_is_sized():
    """A seg dataset added to the dataset registry (here: Duke's entry under another name, with
    Duke's config block) is sized from its registered facts, as Duke is; job_cost once kept
    its own per-dataset facts and failed on it (KeyError 'n_slices')."""
    from dpmed.data.registry import DATASET_REGISTRY

    config, wc, hp = seg_job()
    config["data"]["toyoct"] = config["data"]["duke"]
    DATASET_REGISTRY.add("toyoct", DATASET_REGISTRY["duke"])
    try:
        toy = job_cost.request("seg_train", config, {**wc, "dataset": "toyoct"}, hp)
    finally:
        DATASET_REGISTRY.remove("toyoct")
    assert toy == job_cost.request("seg_train", config, wc, hp)


def test_measured_time_and_memory_sit_beside_the_prediction(tmp_path):
    """Where this run measured a job (its Snakemake benchmark), the table shows the measured
    wall time and peak beside the job-cost model's prediction for the same job, each predicted
    header saying "predicted" and naming the model; the measured values are the file's."""

    config, grid = grid_of(True)
    planted, paths = {}, []
    for study in ("seg", "xcal"):
        job = grid.jobs(study)[0]
        path = tmp_path / STUDIES[study].log(f"{study}_train", "tsv").format(**dict(job.wildcards))
        path.parent.mkdir(parents=True)
        s, rss = 12.5 + len(paths), 432.25 + len(paths)
        path.write_text(f"s\th:m:s\tmax_rss\tmax_vms\n{s}\t0:00:12\t{rss}\t900.0\n")
        planted[job.path] = (s, rss, dict(job.wildcards), study)
        paths.append(str(path))
    frame = job_cost.beside_measured(config, grid, paths)
    columns = list(frame.columns)
    for quantity in ("wall_s", "peak_rss_mb"):
        [measured] = [c for c in columns if c.startswith(f"{quantity} measured")]
        beside = columns[columns.index(measured) + 1]
        assert beside.startswith(quantity) and "predicted" in beside and job_cost.MODEL in beside
    assert all("predicted" in c for c in columns if job_cost.MODEL in c)
    assert sorted(frame["run"]) == sorted(planted)
    for _, row in frame.iterrows():
        s, rss, wc, study = planted[row["run"]]
        hp = grid.params(study, wc)
        peak, seconds = job_cost.predicted(f"{study}_train", config, wc, hp, gpu=False)
        assert row["wall_s measured (Snakemake benchmark)"] == s
        assert row["peak_rss_mb measured (Snakemake benchmark max_rss)"] == rss
        assert row[f"wall_s predicted ({job_cost.MODEL})"] == pytest.approx(seconds)
        assert row[f"peak_rss_mb predicted ({job_cost.MODEL})"] == pytest.approx(peak)
