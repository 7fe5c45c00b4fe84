"""`bench/job_cost.py`: a finished run's Snakemake benchmark files become points of the cost
model (the demo's, a workstation's or a cluster's jobs), a job measured again replaces its
point, and the fit recovers measures made by known coefficients; time is fitted on relative
residuals, so jobs of seconds are not priced by the hours of large ones."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REPO, SMOKE_CONFIG

from dpmed import job_cost
from dpmed.config.checks import check_config, load_configs
from dpmed.studies import STUDIES


def _bench_job_cost():
    """bench/job_cost.py as a module (bench scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_job_cost", REPO / "bench/job_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TIME = {"const": 4.0, "count_step": 0.01, "count_client_round": 0.5, "count_evaluation": 0.2,
        "count_road": 1.0, "road": 3e6, "work_efficientnet_b0": 4e4, "work_resnet18": 9e4,
        "round_static": 7.0, "round_xcal": 9.0}  # fmt: skip
MEM = {"const": 400.0, "act_efficientnet_b0": 300.0, "act_resnet18": 700.0}


def planted_run(folder, config, grid, short: float = 0.0):
    """A run's benchmarks/ in `folder`: every xcal job of `grid` measured as `TIME` and `MEM`
    predict (known host and device MB added), `short` s taken off the first job's seconds.
    Returns the (seconds, peak) written per run path."""
    written = {}
    for i, job in enumerate(grid.jobs("xcal")):
        mem, time = job_cost.features("xcal_train", config, job.wc, job.params)
        seconds = sum(TIME.get(n, TIME.get("round_xcal")) * v for n, v in time.items())
        seconds -= short if i == 0 else 0.0
        peak = mem["host"] + mem["device"] + sum(MEM[n] * mem.get(n, 0.0) for n in MEM)
        tsv = folder / STUDIES["xcal"].log("xcal_train", "tsv").format(**job.wc)
        tsv.parent.mkdir(parents=True, exist_ok=True)
        tsv.write_text(f"s\th:m:s\tmax_rss\tcpu_time\n{seconds}\t0:00:01\t{peak}\t1.0\n")
        written[job.path] = (seconds, peak)
    return written


def test_a_runs_benchmarks_give_back_the_costs_that_made_them(tmp_path):
    """Every xcal job of the smoke grid measured exactly as chosen coefficients predict: each
    becomes a point with its benchmark's seconds and peak, sized from the run's config, and the
    fit over them predicts every job's seconds and peak back (an exact fit: zero relative
    residual, a tight envelope)."""
    bench = _bench_job_cost()
    config = load_configs([SMOKE_CONFIG])
    grid = check_config(config, REPO / "config" / "schema.yaml")
    written = planted_run(tmp_path, config, grid)
    points = bench.benchmark_points(tmp_path, config, "run")
    assert len(points) == len(written) and {p["rule"] for p in points} == {"xcal_train"}
    model = {"rules": bench.fit_all(points)}
    for point in points:
        seconds, peak = written[STUDIES["xcal"].path.format(**point["wildcards"])]
        assert point["measured"] == {"time": seconds, "mem": peak}
        cost = job_cost.predict("xcal_train", point["mem"], point["time"], model)
        assert cost.seconds == pytest.approx(seconds, rel=1e-6)
        assert cost.host_mb + cost.compute_mb == pytest.approx(peak, rel=1e-6)


def test_a_job_shorter_than_the_sampling_interval_gives_its_time_only(tmp_path):
    """Snakemake samples a job's memory at its start, then every `logging.benchmark_interval`
    seconds: a job that ended sooner has only its start's sample, no peak (the demo's 2-second
    attacks read 1–8 MB and pulled the memory envelope's objective)."""
    bench = _bench_job_cost()
    config = load_configs([SMOKE_CONFIG])
    grid = check_config(config, REPO / "config" / "schema.yaml")
    config["logging"]["benchmark_interval"] = 1e6  # every planted job is shorter
    planted_run(tmp_path, config, grid)
    points = bench.benchmark_points(tmp_path, config, "run")
    assert points and all(set(p["measured"]) == {"time"} for p in points)
    config["device"] = "auto"
    with pytest.raises(SystemExit, match="CPU"):
        bench.benchmark_points(tmp_path, config, "run")


def test_a_job_measured_again_replaces_its_point_and_the_others_stay(tmp_path):
    """Points are keyed by their job (rule, wildcards, params, data): a rerun's point of a job
    replaces the earlier one, whatever its source; jobs it did not measure keep theirs; the
    saved points are one JSON line each and read back with their features."""
    bench = _bench_job_cost()
    config = load_configs([SMOKE_CONFIG])
    grid = check_config(config, REPO / "config" / "schema.yaml")
    planted_run(tmp_path / "a", config, grid)
    first = bench.benchmark_points(tmp_path / "a", config, "run")
    planted_run(tmp_path / "b", config, grid, short=1.0)
    again = bench.benchmark_points(tmp_path / "b", config, "small")[:1]
    merged = bench.merged(first, again)
    assert len(merged) == len(first) and merged[0] is again[0] and merged[1:] == first[1:]
    path = tmp_path / "points.jsonl"
    bench.write_points(merged, path)
    assert len(path.read_text().splitlines()) == len(merged)
    assert all("mem" not in json.loads(line) for line in path.read_text().splitlines())
    assert bench.read_points(path) == merged


def test_time_is_fitted_on_relative_residuals():
    """Jobs of seconds beside jobs of hours whose time has a part no feature carries (as the
    paper-size points have): an absolute least-squares fit gave that part to the constant and
    priced the 5-second jobs in tens of minutes; the relative fit keeps every job, small and
    large, within a small factor of its time."""
    bench = _bench_job_cost()
    rows = [{"time": {"const": 1.0, "work_unet": w}, "measured": {"time": 5.0 + 2.0 * w}}
            for w in (0.0, 0.1, 0.5, 1.0, 2.0)]  # fmt: skip
    rows += [{"time": {"const": 1.0, "work_unet": w}, "measured": {"time": 3000.0 + 2.0 * w}}
             for w in np.linspace(1e4, 1e5, 20)]  # fmt: skip
    coef = bench.fit(rows, "time")
    for row in rows:
        predicted = sum(coef[n] * v for n, v in row["time"].items())
        assert 1 / 3 <= predicted / row["measured"]["time"] <= 3, (row, coef)
