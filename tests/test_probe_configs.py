"""Adversarial configs (issue 44): each stops when the config loads, naming the key and the
value, and for a key given twice the file and line. NaN passed every schema bound (its
comparisons are false) and Inf every bound from below; a repeated YAML key kept its last value
silently; more xcal clients than training images failed only in the job. Most cases call the
load check directly; a few run `snakemake -n` (at once, in parallel) to show the workflow stops
the same way."""

from __future__ import annotations

import copy
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG, SNAKEMAKE

from dpmed.config.checks import check_config, load_config_file, load_configs
from dpmed.errors import ConfigError

SCHEMA = REPO / "config" / "schema.yaml"
NAN, INF = math.nan, math.inf
SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())

# Every kind of number of the top level, the data sections and each study: NaN is refused
# everywhere (eps included).
NAN_KEYS = [
    "logging.benchmark_interval",
    "resources.gpu_speedup",
    "resources.max_runtime",
    "resources.max_mem_mb",
    "resources.seg_train.mem_scale",
    "resources.xcal_train.runtime_scale",
    "audit.canaries",
    "audit.confidence",
    "audit.cells[0].noise_scales[0]",
    "data.fets.val_fraction",
    "data.fets.synthetic.subjects_scale",
    "data.duke.split[0]",
    "data.duke.synthetic.n_subjects",
    "data.umn.synthetic.fluid_scale",
    "data.covidct.synthetic.lesion_scale",
    "data.bloodmnist.synthetic.counts[0]",
    "seg.defaults.epochs",
    "seg.defaults.lr",
    "seg.defaults.clip_norm",
    "seg.defaults.delta",
    "seg.defaults.autos_gamma",
    "seg.defaults.r",
    "seg.defaults.quantiles[0]",
    "seg.defaults.attack_calibration",
    "seg.defaults.dice_weight",
    "seg.grid[0].params.lr",
    "seg.grid[4].sweep.clip_norm[0]",
    "seg.grid[0].eps[0]",
    "fets.defaults.lr",
    "fets.defaults.clip_norm",
    "fets.defaults.delta",
    "fets.defaults.participation",
    "fets.defaults.local_epochs",
    "fets.grid[1].sweep.participation[0]",
    "fets.grid[0].eps[0]",
    "xcal.defaults.lr",
    "xcal.defaults.clip_norm",
    "xcal.defaults.delta",
    "xcal.defaults.signal_fraction",
    "xcal.defaults.band",
    "xcal.defaults.top_q",
    "xcal.defaults.ema",
    "xcal.defaults.dirichlet_alpha",
    "xcal.defaults.brightness[0]",
    "xcal.defaults.momentum",
    "xcal.defaults.width_scale",
    "xcal.defaults.road_percentages[0]",
    "xcal.defaults.presets.balanced[0]",
    "xcal.grid[2].params.lr",
    "xcal.grid[1].eps[0]",
]
# Numbers the schema bounds only from below, which Inf passed (eps takes inf: non-private).
INF_KEYS = [
    "logging.benchmark_interval",
    "resources.gpu_speedup",
    "resources.max_runtime",
    "resources.seg_train.mem_scale",
    "audit.cells[0].noise_scales[0]",
    "seg.defaults.lr",
    "seg.defaults.clip_norm",
    "seg.defaults.autos_gamma",
    "seg.defaults.r",
    "seg.defaults.dice_weight",
    "seg.grid[0].params.clip_norm",
    "seg.grid[4].sweep.lr[0]",
    "fets.defaults.lr",
    "fets.defaults.clip_norm",
    "fets.defaults.local_epochs",
    "xcal.defaults.lr",
    "xcal.defaults.clip_norm",
    "xcal.defaults.dirichlet_alpha",
    "xcal.defaults.brightness[1]",
    "xcal.defaults.presets.logit[0]",
]
NON_FINITE = (
    [(key, NAN) for key in NAN_KEYS]
    + [(key, INF) for key in INF_KEYS]
    + [("seg.grid[0].eps[1]", -INF), ("xcal.defaults.lr", -INF)]
)


def smoke() -> dict[str, Any]:
    """A fresh copy of config/smoke.yaml as loaded."""
    return copy.deepcopy(SMOKE)


def set_key(config: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted key (`a.b[0].c`) to `value`, creating missing mappings and lists."""
    parts = [int(p[1:-1]) if p.startswith("[") else p for p in re.findall(r"\[\d+\]|[^.\[]+", key)]
    node: Any = config
    for part, following in zip(parts, parts[1:], strict=False):
        if isinstance(part, str) and part not in node:
            node[part] = [] if isinstance(following, int) else {}
        node = node[part]
    if isinstance(node, list) and parts[-1] == len(node):
        node.append(value)
    else:
        node[parts[-1]] = value


@pytest.mark.parametrize(("key", "value"), NON_FINITE, ids=[f"{k}={v}" for k, v in NON_FINITE])
def test_nan_or_inf_stops_at_load_naming_key_and_value(key, value):
    config = smoke()
    set_key(config, key, value)
    with pytest.raises(ConfigError) as info:
        check_config(config, SCHEMA)
    assert info.value.key == key and f"got {value}" in info.value.problem, info.value


def test_eps_inf_is_still_a_non_private_run():
    config = smoke()
    config["seg"]["grid"][0]["eps"] = [50, INF]
    assert any(job.wc["eps"] == "inf" for job in check_config(config, SCHEMA).jobs("seg"))


CLIENTS = [
    ("xcal.grid[0]", [5000], "bloodmnist", 960),
    ("xcal.grid[2]", [1, 241], "pneumoniamnist", 240),
    ("xcal.grid[3]", [3, 961], "dermamnist", 960),
]


@pytest.mark.parametrize(("block", "clients", "dataset", "n_train"), CLIENTS,
                         ids=[f"{b}.clients={c[-1]}" for b, c, _, _ in CLIENTS])  # fmt: skip
def test_more_clients_than_training_images_stops_at_load(block, clients, dataset, n_train):
    config = smoke()
    set_key(config, f"{block}.clients", clients)
    with pytest.raises(ConfigError) as info:
        check_config(config, SCHEMA)
    problem = info.value.problem
    assert info.value.key == f"{block}.clients", info.value
    assert f"{clients[-1]} clients" in problem and f"{n_train} training" in problem
    assert f"data.{dataset}.synthetic.counts" in problem


def test_as_many_clients_as_training_images_loads():
    config = smoke()
    config["xcal"]["grid"][2]["clients"] = [1, 240]
    check_config(config, SCHEMA)


def test_clients_of_real_data_are_counted_by_the_job(tmp_path):
    config = smoke()
    config["data"]["bloodmnist"]["raw"] = str(tmp_path)  # the dataset of xcal.grid[0]
    config["xcal"]["grid"][0]["clients"] = [5000]
    check_config(config, SCHEMA)


# A key given twice: (case, an edit (old, new) of smoke.yaml's text or None, a second config
# file's text or None, the key). The error names the file that repeats it, the line of the
# repetition and the key.
SMOKE_TEXT = SMOKE_CONFIG.read_text()
DUPLICATES = [
    ("top-level", ("device: cpu\n", "device: cpu\ndevice: cuda\n"), None, "device"),
    ("study-defaults", ("    lr: 0.001\n", "    lr: 0.001\n    lr: 0.5\n"), None, "lr"),
    ("grid-block-eps", ("      eps: [50, inf]\n", "      eps: [50, inf]\n      eps: [inf]\n"),
     None, "eps"),
    ("data-flow-mapping", ("n_slices: 120,", "n_slices: 120, n_slices: 3,"), None, "n_slices"),
    ("override-top-level", None, "seed: 0\ndevice: cpu\ndevice: cuda\n", "device"),
    ("override-nested", None, "xcal:\n  defaults:\n    lr: 0.1\n    lr: 0.2\n", "lr"),
    ("override-list-item", None, "audit:\n  cells:\n    - run: a\n      run: b\n", "run"),
    ("override-resources", None, "resources:\n  max_mem_mb: 1000\n  max_mem_mb: 9\n",
     "max_mem_mb"),
    ("override-json", None, '{"device": "cpu",\n "device": "cuda"}\n', "device"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "edit", "override", "key"), DUPLICATES,
                         ids=[case[0] for case in DUPLICATES])  # fmt: skip
def test_a_key_given_twice_stops_at_load_naming_file_line_and_key(
    tmp_path, case, edit, override, key
):
    main = tmp_path / "smoke.yaml"
    text = SMOKE_TEXT.replace(*edit, 1) if edit else SMOKE_TEXT
    main.write_text(text)
    paths, bad = [main], main
    if override is not None:
        bad = tmp_path / "override.yaml"
        bad.write_text(override)
        paths, text = [main, bad], override
    # the repetition: the last occurrence of the key in the edit (or the override)
    snippet = edit[1] if edit else text
    before = text.index(snippet) + snippet.rindex(key)
    line = text[:before].count("\n") + 1
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}:{line}:\d+: key '{key}'"):
        load_configs(paths)


def test_merge_keys_and_aliases_are_not_duplicates(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {lr: 0.1, epochs: 2}\nblock:\n  <<: *b\n  lr: 0.2\nother: *b\n")
    assert load_config_file(path)["block"] == {"lr": 0.2, "epochs": 2}


def test_the_repositorys_yaml_files_hold_no_key_twice():
    """Every YAML of this repository that the workflow or Snakemake reads: configs, schema,
    profiles, the conda environment."""
    files = [*REPO.glob("config/*.yaml"), *REPO.glob("profiles/*/config.yaml"),
             *REPO.glob("envs/*.yaml")]  # fmt: skip
    assert len(files) >= 6
    for path in files:
        load_config_file(path)


def _eps_nan(config: dict[str, Any]) -> None:
    config["xcal"]["grid"][1]["eps"] = [NAN]


def _many_clients(config: dict[str, Any]) -> None:
    config["xcal"]["grid"][0]["clients"] = [5000]


# `snakemake -n` on a few cases: case → (an edit of the whole smoke config, or the text of a
# second --configfile; what the error must say).
DRY_RUNS = {
    "seg-lr-nan": ("seg: {defaults: {lr: .nan}}\n", ["config key 'seg.defaults.lr'", "got nan"]),
    "xcal-eps-nan": (_eps_nan, ["config key 'xcal.grid[1].eps[0]'", "got nan"]),
    "xcal-clients": (_many_clients, ["config key 'xcal.grid[0].clients'", "5000 clients", "960"]),
    "override-duplicate-device": ("device: cpu\ndevice: cuda\n", [":2:1: key 'device'"]),
}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """case → (its last --configfile, the dry run's result); the runs go at once, each in a
    working directory of its own."""
    started = {}
    for case, (change, _) in DRY_RUNS.items():
        folder = tmp_path_factory.mktemp(case)
        path = folder / f"{case}.yaml"
        if isinstance(change, str):
            path.write_text(change)
            paths = [SMOKE_CONFIG, path]
        else:
            config = smoke()
            change(config)
            path.write_text(yaml.safe_dump(config))
            paths = [path]
        cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-n", "--cores", "1",
               "--configfile", *map(str, paths)]  # fmt: skip
        process = subprocess.Popen(
            cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        started[case] = (path, cmd, process)
    results = {}
    for case, (path, cmd, process) in started.items():
        output, _ = process.communicate(timeout=300)
        results[case] = (path, subprocess.CompletedProcess(cmd, process.returncode, output))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DRY_RUNS))
def test_snakemake_dry_run_stops_at_load(dry_runs, case):
    path, result = dry_runs[case]
    assert result.returncode != 0, result.stdout[-2000:]
    for needed in DRY_RUNS[case][1]:
        assert needed in result.stdout, result.stdout[-2000:]
    if case.startswith("override"):
        assert f"{path}:2:1: key 'device'" in result.stdout
