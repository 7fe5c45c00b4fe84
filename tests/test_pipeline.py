"""The whole pipeline as one product: rerunning cells of every rule from scratch is byte-identical,
editing one ε reruns only its cells and what reads them, a SLURM dry run of the smoke grid fits
a small node (and every smoke job peaked below its request), and the HTML report holds every
table and figure."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG, TRAINING_RULES, run_snakemake, site_slurm_profile

pytestmark = pytest.mark.slow

DETERMINISTIC = ("data/processed", "results/tables", "results/figures")


def digests(root: Path, folders: tuple[str, ...] = DETERMINISTIC) -> dict[str, str]:
    """sha256 of every file below the given folders of `root`, keyed by relative path."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for folder in folders
        for path in sorted((root / folder).rglob("*"))
        if path.is_file()
    }


def planned_jobs(dry_run_output: str) -> list[dict[str, str]]:
    """The jobs of a `snakemake -n` listing: rule name plus the job's indented fields. Members
    of a group job (`group job seg_cell`) are listed one level deeper."""
    jobs = []
    for line in dry_run_output.splitlines():
        rule = re.match(r"^(?: {4})?(?:local)?rule (\w+):$", line)
        if rule:
            jobs.append({"rule": rule.group(1)})
        field = re.match(r"^ {4}(?: {4})?(\w+): (.*)$", line)
        if field and jobs:
            jobs[-1].setdefault(field.group(1), field.group(2))
    return jobs


def edited_smoke_config(tmp_path: Path, edit) -> Path:
    """config/smoke.yaml with `edit(config)` applied, written to `tmp_path`."""
    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    edit(config)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(config))  # sorted keys: the order must not matter
    return path


# Rerun from scratch in a copy of the smoke run: a seg cell of each network family (a plain
# UNet, UNet++ with adaptive morphology, Inf-Net with a fixed closing), a private fets cell (and
# its privacy audits), the lightest XCal-FL cell, and every table and figure. A second full
# smoke DAG would check every cell but costs a third of `make test`; these cover every
# training, attack, audit, table and figure rule. The data stage's rerun from scratch is
# test_workflow.py::test_data_stage_is_byte_identical_across_runs.
RERUN = (
    "results/seg/duke/unet/flat/none/eps10/seed0",
    "results/seg/covidct/infnet/flat/close-k3/eps50/seed0",
    "results/seg/duke/unetpp/flat/adaptive-v2/eps50/seed0",
    "results/fets/dp_simagg/sound/eps10/seed0",
    "results/audit/fets",
    "results/xcal/pneumoniamnist/efficientnet_b0/xcal-logit/iid/c3/eps5/seed0",
    "results/tables",
    "results/figures",
    "results/measured",
)


def test_rerun_from_scratch_is_byte_identical(smoke_run, tmp_path_factory):
    again = tmp_path_factory.mktemp("smoke_again") / "run"
    shutil.copytree(smoke_run, again, symlinks=True)  # keeps mtimes: only what is removed reruns
    for folder in RERUN:
        assert (again / folder).is_dir(), folder
        shutil.rmtree(again / folder)
    result = run_snakemake(
        "--directory", str(again), "--configfile", str(SMOKE_CONFIG), "--cores", "2"
    )  # fmt: skip
    ran = {job["rule"] for job in planned_jobs(result.stdout + result.stderr)}
    assert {"privacy_audit", *TRAINING_RULES} <= ran
    first, second = digests(smoke_run), digests(again)
    assert first == second
    # Every figure has its PDF twin, every table its Markdown and HTML twins; measured
    # wall-clock lives outside the compared folders.
    names = set(first)
    assert any(n.startswith("results/figures/seg_fig12") for n in names)
    for name in names:
        if name.endswith(".png"):
            assert name[:-4] + ".pdf" in names
        if name.startswith("results/tables") and name.endswith(".csv"):
            assert name[:-4] + ".md" in names and name[:-4] + ".html" in names
    assert (again / "results/measured/seg_fig8_training_time.png").exists()


def covidct_block(config: dict) -> dict:
    """The smoke grid's only COVID-19 CT block (its attack is off)."""
    (block,) = [b for b in config["seg"]["grid"] if b["datasets"] == ["covidct"]]
    return block


def duke_flat_eps_block(config: dict) -> dict:
    """The smoke grid's Duke UNet block of flat DP-SGD at two more ε (its cells are attacked)."""
    (block,) = [b for b in config["seg"]["grid"] if b["eps"] == [10, 200]]
    return block


def test_editing_one_eps_reruns_only_its_cells_and_readers(smoke_run, tmp_path):
    def edit(config):
        block = duke_flat_eps_block(config)
        assert (block["models"], block["clips"], block["morphs"]) == (["unet"], ["flat"], ["none"])
        block["eps"] = [10, 150]

    edited = edited_smoke_config(tmp_path, edit)
    result = run_snakemake("-n", "--directory", str(smoke_run), "--configfile", str(edited))
    jobs = planned_jobs(result.stdout)
    training = [job for job in jobs if job["rule"] in TRAINING_RULES]
    # The one cell at the new ε: training and attack, nothing else.
    assert sorted((job["rule"], job["wildcards"]) for job in training) == sorted(
        (rule, "dataset=duke, model=unet, clip=flat, morph=none, eps=150, seed=0")
        for rule in ("seg_train", "seg_attack")
    )
    readers = {job["rule"] for job in jobs} - set(TRAINING_RULES)
    assert {"privacy_summary", "seg_main_table", "seg_clipping_figure"} <= readers
    assert not any(rule.startswith(("fets_", "xcal_", "preprocess", "synth")) for rule in readers)
    for rule, outputs in (("seg_main_table", "seg_main_duke"), ("seg_clipping_figure", "fig3")):
        assert [outputs in job["output"] for job in jobs if job["rule"] == rule] == [True]
    # The old ε's outputs are not deleted or rerun, just no longer targets.
    assert (smoke_run / "results/seg/duke/unet/flat/none/eps200/seed0/model.pt").exists()


def test_editing_block_params_reruns_that_block_for_changed_params(smoke_run, tmp_path):
    def edit(config):
        covidct_block(config)["params"]["clip_norm"] = 2.5

    edited = edited_smoke_config(tmp_path, edit)
    result = run_snakemake("-n", "--directory", str(smoke_run), "--configfile", str(edited))
    training = [job for job in planned_jobs(result.stdout) if job["rule"] in TRAINING_RULES]
    assert {job["rule"] for job in training} == {"seg_train"}  # the block's attack is off
    assert all(job["wildcards"].startswith("dataset=covidct,") for job in training)
    assert len(training) == 4  # every job of the block: its params hold C, used or not
    assert all(job["reason"].startswith("Params have changed") for job in training)


def dry_run_requests(tmp_path: Path, *config: str) -> list[dict[str, str]]:
    """The training and attack jobs of a SLURM dry run, each with its resources as a dict."""
    profile = site_slurm_profile(tmp_path)
    result = run_snakemake("-n", "--profile", str(profile), "--directory", str(tmp_path / "run"),
                           *config)  # fmt: skip
    assert re.search(r"total\s+\d+", result.stdout)
    jobs = [job for job in planned_jobs(result.stdout) if job["rule"] in TRAINING_RULES]
    for job in jobs:
        job["resources"] = dict(item.split("=", 1) for item in job["resources"].split(", "))
        job["wildcards"] = dict(item.split("=", 1) for item in job["wildcards"].split(", "))
    return jobs


def test_smoke_slurm_dry_run_fits_a_small_node(tmp_path):
    """The smoke grid on a cluster asks for what its jobs need: every job, fets included, fits a
    22 GB node (a constant 32 GB request for fets_train could not be submitted). The paper
    grid's requests are test_gpu_requests.py::test_every_paper_job_asks_slurm_for_what_the_cost_
    model_predicts (the same profile through Snakemake's own parser, its DAG built once)."""
    smoke = dry_run_requests(tmp_path / "smoke", "--configfile", str(SMOKE_CONFIG),
                             "--config", "device=auto")  # fmt: skip
    assert {job["rule"] for job in smoke} == set(TRAINING_RULES)
    assert all(job["resources"]["slurm_partition"] == "gpu" for job in smoke)
    assert max(int(job["resources"]["mem_mb"]) for job in smoke) <= 16000


def test_every_smoke_job_peaked_below_its_memory_request(smoke_run):
    from dpmed import job_cost
    from dpmed.config.checks import check_config, load_configs
    from dpmed.config.grid import wildcards_from_path

    config = load_configs([SMOKE_CONFIG])
    grid = check_config(config, REPO / "config" / "schema.yaml")
    checked = 0
    for rule in TRAINING_RULES:
        study = rule.partition("_")[0]
        for tsv in sorted((smoke_run / "benchmarks" / rule).rglob("*.tsv")):
            run = tsv.relative_to(smoke_run / "benchmarks" / rule).with_suffix("")
            wc = wildcards_from_path(study, f"results/{study}/{run}")
            header, values = tsv.read_text().splitlines()[:2]
            peak = float(dict(zip(header.split("\t"), values.split("\t"), strict=True))["max_rss"])
            want = job_cost.request(rule, config, wc, grid.params(study, wc))
            assert peak <= want.mem_mb, (rule, run, peak, want)
            checked += 1
    assert checked >= 60  # every training and attack job of the smoke grid


def test_report_holds_every_table_and_figure(smoke_run):
    report = smoke_run / "results" / "report.html"
    run_snakemake(
        "--report", str(report), "--directory", str(smoke_run), "--configfile", str(SMOKE_CONFIG)
    )
    html = report.read_text()
    shown = [
        path.name
        for folder in ("results/tables", "results/figures", "results/measured")
        for path in (smoke_run / folder).iterdir()
        if path.suffix in (".html", ".png")  # a table is shown as its HTML twin
    ]
    assert len(shown) >= 35  # every table and figure of the smoke grid
    for name in shown:
        assert name in html, name
    # The report embeds the privacy summary's HTML table itself (base64), not a CSV download.
    summary = (smoke_run / "results/tables/privacy_summary.html").read_bytes()
    assert b"<table" in summary and base64.b64encode(summary).decode() in html
    for category in ("seg (paper 002)", "fets (paper 000)", "xcal (paper 001)", "privacy"):
        assert category in html


def test_every_privacy_record_says_what_it_covers(smoke_run):
    """Every run's privacy.json names what its guarantee covers and what beside it does not,
    and its dataset's privacy unit; a `not_covered` entry that names a file of the run folder
    names one that exists."""
    from dpmed.data.registry import privacy_unit

    records = sorted((smoke_run / "results").glob("*/**/privacy.json"))
    assert {path.relative_to(smoke_run / "results").parts[0] for path in records} == {
        "seg", "fets", "xcal"
    }  # fmt: skip
    for path in records:
        record = json.loads(path.read_text())
        assert isinstance(record["not_covered"], list) and record["not_covered"], path
        assert bool(record["covers"]) == (record["guarantee"] != "none"), path
        study, dataset = path.relative_to(smoke_run / "results").parts[:2]
        assert record["privacy_unit"] == privacy_unit("fets" if study == "fets" else dataset)
        for entry in record["not_covered"]:
            named = entry.split(":")[0].split(",")[0].split(" ")[0]
            if named.endswith((".csv", ".json", ".npz")) and "/" in named:
                assert (path.parent / named).exists(), (path, named)
