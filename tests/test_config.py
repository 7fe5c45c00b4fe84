"""Config schema, semantic checks and grid expansion."""

from __future__ import annotations

import copy
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from snakemake_interface_common.exceptions import WorkflowError

from dpmed.config.checks import check_config
from dpmed.config.grid import job_seed, wildcard_patterns, wildcards_from_path
from dpmed.config.wildcards import EPS_PATTERN, format_eps, parse_eps
from dpmed.data.registry import DATASETS
from dpmed.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "config" / "schema.yaml"


def load(name: str) -> dict:
    return yaml.safe_load((REPO / "config" / name).read_text())


@pytest.fixture
def smoke() -> dict:
    return load("smoke.yaml")


def test_paper_grid_sizes_match_hand_count():
    grid = check_config(load("config.yaml"), SCHEMA)
    # seg: per model × morph × seed, 1 non-private + 4 clip rules at eps 200.
    duke, umn, covid = 3 * 10 * 5 * 3, 2 * 7 * 5 * 3, 2 * 7 * 5 * 3
    # + Table 2 (UNet++, 6 quantile morphs × 5 rules × 3 seeds), the sound per-image adaptive
    # variants (3 models × 4 private rules × 3 policies × 3 seeds) and Fig. 2 (UNet on Duke and
    # UMN, 4 C × 4 lr × 4 seeds).
    table2, sound, fig2 = 6 * 5 * 3, 3 * 4 * 3 * 3, 2 * 4 * 4 * 4
    assert len(grid.jobs("seg")) == duke + umn + covid + table2 + sound + fig2 == 1196
    # fets: simagg, dp_simagg {paper, sound} × {1, 10}, fedavg, dp_fedavg sound × {1, 10};
    # + the sweep: simagg, fedavg, dp_simagg {paper, sound} and dp_fedavg sound × 4 eps0, at
    # 4 participations; six seeds for the plain cells (the power plan), three for the sweep.
    assert len(grid.jobs("fets")) == (1 + 4 + 1 + 2) * 6 + 4 * (2 + 3 * 4) * 3
    # xcal: 126 main (with the random-σ_t control) + 12 centralized + 54 clients×shift + 96
    # ablation (7 presets and the control) + 12 at the paper's operating point (xcal-paper),
    # minus the 6 + 24 cells that blocks 3 and 4 share with block 1; three seeds each.
    assert len(grid.jobs("xcal")) == (126 + 12 + 54 + 96 + 12 - 6 - 24) * 3
    assert grid.datasets() == list(DATASETS)  # every dataset, in registry order


def test_smoke_grid_covers_every_value(smoke):
    grid = check_config(smoke, SCHEMA)
    # seg: duke unet 5 clips (+ flat at 2 more eps, + seed 1 of none, flat and Auto-S, + seed 2
    # of flat and Auto-S), unetpp 6 morphs under flat clipping + its non-private reference, 2
    # quantile variants, the 2 × 2 lr × C sweep on duke, umn 4, covidct 4.
    assert len(grid.jobs("seg")) == 5 + 2 + 3 + 2 + 6 + 1 + 2 + 4 + 4 + 4
    # fets: fedavg, simagg at inf; dp_simagg {paper, sound} and dp_fedavg sound at eps0 {1, 10};
    # the sweep at 2 participations: fedavg at inf, dp_fedavg at 2 eps0, dp_simagg sound at 1.
    assert len(grid.jobs("fets")) == 2 + 4 + 2 + 2 * (1 + 2 + 1)
    # xcal: nondp at inf on each dataset; bloodmnist static/agp/agp-dp/xcal/xcal-paper/
    # xcal-random at 5; pneumoniamnist centralized c1 and xcal-logit c3; dermamnist static
    # {label, covariate} × {3, 5} clients.
    assert len(grid.jobs("xcal")) == 3 + 6 + 2 + 4
    seen = {
        (study, key, value)
        for study in ("seg", "fets", "xcal")
        for job in grid.jobs(study)
        for key, value in job.wildcards
    }
    for value in ("unet", "unetpp", "lfunet", "infnet"):
        assert ("seg", "model", value) in seen
    for value in ("none", "flat", "nsgd", "autos", "psac"):
        assert ("seg", "clip", value) in seen
    for value in ("fedavg", "simagg", "dp_simagg", "dp_fedavg"):
        assert ("fets", "aggregator", value) in seen
    for value in ("none", "paper", "sound"):
        assert ("fets", "dpmode", value) in seen
    for value in ("nondp", "centralized", "static", "agp", "agp-dp", "xcal"):
        assert ("xcal", "method", value) in seen
    for value in ("iid", "label", "covariate"):
        assert ("xcal", "shift", value) in seen


def test_every_job_path_matches_the_wildcard_constraints():
    grid = check_config(load("config.yaml"), SCHEMA)
    for study in ("seg", "fets", "xcal"):
        for job in grid.jobs(study):
            for wildcard, value in job.wildcards:
                assert re.fullmatch(wildcard_patterns()[wildcard], value), (wildcard, value)


def test_block_params_override_defaults():
    grid = check_config(load("config.yaml"), SCHEMA)
    umn = grid.params(
        "seg",
        {
            "dataset": "umn",
            "model": "unet",
            "clip": "flat",
            "morph": "none",
            "eps": "200",
            "seed": "0",
        },
    )
    assert umn["lr"] == 0.0003 and umn["epochs"] == 50
    outside = grid.params(
        "seg",
        {
            "dataset": "umn",
            "model": "unet",
            "clip": "flat",
            "morph": "none",
            "eps": "8",
            "seed": "0",
        },
    )
    assert outside["lr"] == 0.001  # a target outside the grid runs with the study defaults


def test_schema_fills_defaults(smoke):
    del smoke["data"]["duke"]["grader"]
    check_config(smoke, SCHEMA)
    assert smoke["data"]["duke"]["grader"] == 1 and smoke["device"] == "cpu"


@pytest.mark.parametrize(
    ("path", "value", "key"),
    [
        (("seg", "grid", 0, "eps", 0), 0, "['eps']"),
        (("seg", "grid", 0, "eps", 0), -1.5, "['eps']"),
        (("seg", "defaults", "delta"), 0.0, "['delta']"),
        (("fets", "defaults", "delta"), 1.0, "['delta']"),
        (("seg", "grid", 0, "models", 0), "resnet50", "['models']"),
        (("xcal", "grid", 0, "methods", 0), "fedprox", "['methods']"),
        (("seg", "grid", 0, "datasets", 0), "brats", "['datasets']"),
        (("fets", "defaults", "participation"), 0, "['participation']"),
        (("fets", "defaults", "participation"), 1.5, "['participation']"),
        (("data", "duke", "split"), [0.6, 0.2], "['split']"),
        (("seg", "defaults", "epochs"), 0, "['epochs']"),
        (("seg", "defaults", "unknown_key"), 1, "unknown_key"),
        # registry names, put into the schema when it is loaded (`load_schema`)
        (("seg", "grid", 0, "clips", 0), "huber", "['clips']"),
        (("seg", "grid", 0, "morphs", 0), "erode-k3", "['morphs']"),
        (("fets", "grid", 0, "aggregators", 0), "fedprox", "['aggregators']"),
        (("fets", "grid", 0, "dpmodes", 0), "local", "['dpmodes']"),
        (("fets", "defaults", "simagg_distance"), "cosine", "['simagg_distance']"),
        (("xcal", "grid", 0, "shifts", 0), "quantity", "['shifts']"),
        (("data", "brats"), {"raw": "synthetic"}, "brats"),
    ],
)
def test_schema_errors_name_the_key(smoke, path, value, key):
    node = smoke
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with pytest.raises(WorkflowError) as info:
        check_config(smoke, SCHEMA)
    assert key in str(info.value)


def test_conflicting_params_for_one_job(smoke):
    block = copy.deepcopy(smoke["seg"]["grid"][0])
    block["params"] = {"lr": 0.5}
    smoke["seg"]["grid"].append(block)
    last = len(smoke["seg"]["grid"]) - 1
    with pytest.raises(ConfigError, match=rf"seg\.grid\[{last}\].*seg\.grid\[0\]"):
        check_config(smoke, SCHEMA)


def test_same_job_in_two_blocks_with_same_params_is_fine(smoke):
    jobs = len(check_config(copy.deepcopy(smoke), SCHEMA).jobs("seg"))
    smoke["seg"]["grid"].append(copy.deepcopy(smoke["seg"]["grid"][0]))
    assert len(check_config(smoke, SCHEMA).jobs("seg")) == jobs


def test_block_without_valid_combination(smoke):
    smoke["seg"]["grid"][0].update(clips=["none"], eps=[8])
    with pytest.raises(ConfigError, match=r"seg\.grid\[0\].*clip 'none'"):
        check_config(smoke, SCHEMA)


def test_used_dataset_must_be_configured(smoke):
    del smoke["data"]["umn"]
    with pytest.raises(ConfigError, match=r"data\.umn"):
        check_config(smoke, SCHEMA)


def test_real_data_folder_must_exist(smoke, tmp_path):
    smoke["data"]["duke"]["raw"] = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"data\.duke\.raw.*nowhere"):
        check_config(smoke, SCHEMA)


def test_split_fractions_must_sum_to_one(smoke):
    smoke["data"]["umn"]["split"] = [0.6, 0.3, 0.3]
    with pytest.raises(ConfigError, match=r"data\.umn\.split"):
        check_config(smoke, SCHEMA)


def test_xcal_preset_must_exist(smoke):
    smoke["xcal"]["grid"][1]["methods"] = ["xcal-margin"]
    with pytest.raises(ConfigError, match=r"xcal\.grid\[1\]\.methods.*presets\.margin"):
        check_config(smoke, SCHEMA)


def test_quantiles_must_be_ordered(smoke):
    smoke["seg"]["defaults"]["quantiles"] = [85, 20]
    with pytest.raises(ConfigError, match=r"seg\.defaults\.quantiles"):
        check_config(smoke, SCHEMA)


def test_yaml_infinity_and_string_inf_are_the_same_cell(smoke):
    smoke["seg"]["grid"][0]["eps"] = [50, float("inf")]
    with_float = [j.path for j in check_config(smoke, SCHEMA).jobs("seg")]
    smoke["seg"]["grid"][0]["eps"] = [50, "inf"]
    assert with_float == [j.path for j in check_config(smoke, SCHEMA).jobs("seg")]


@given(st.floats(min_value=1e-9, max_value=1e12, allow_nan=False) | st.integers(1, 10**9))
def test_format_eps_round_trips_and_matches_the_constraint(eps):
    text = format_eps(eps)
    assert re.fullmatch(EPS_PATTERN, text)
    assert parse_eps(text) == float(eps)


def test_job_seed_is_a_stable_hash():
    wc = {"aggregator": "fedavg", "dpmode": "none", "eps": "inf", "seed": "3"}
    text = "\x1f".join(["fets", "aggregator=fedavg", "dpmode=none", "eps=inf", "seed=3"])
    expected = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % 2**32
    assert job_seed("fets", wc) == expected
    code = f"from dpmed.config.grid import job_seed;print(job_seed('fets', {wc!r}))"
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "123", "PYTHONPATH": str(REPO / "src")},
    )
    assert int(other.stdout) == expected


def test_sweep_block_expands_clip_norm_and_lr(smoke):
    grid = check_config(smoke, SCHEMA)
    swept = [job for job in grid.jobs("seg") if job.block == "seg.grid[4]"]
    cells = {(job.wc["dataset"], job.wc["clip"]): job.params for job in swept}
    assert len(cells) == 2 * 2
    params = cells[("duke", "flat-C0.5-lr0.01")]
    assert (params["clip_norm"], params["lr"]) == (0.5, 0.01)
    assert params["epochs"] == smoke["seg"]["defaults"]["epochs"]
    # A file target outside the grid takes its sweep values from the folder name.
    outside = {"dataset": "duke", "model": "unet", "clip": "autos-C3-lr1e-05", "morph": "none",
               "eps": "7", "seed": "9"}  # fmt: skip
    assert {k: grid.params("seg", outside)[k] for k in ("clip_norm", "lr")} == {
        "clip_norm": 3.0,
        "lr": 1e-05,
    }


def test_sweep_cannot_apply_to_non_private_cells(smoke):
    smoke["seg"]["grid"][4].update(clips=["none"], eps=["inf"])
    with pytest.raises(ConfigError, match=r"seg\.grid\[4\]"):
        check_config(smoke, SCHEMA)


def test_wildcards_round_trip_through_paths(smoke):
    grid = check_config(smoke, SCHEMA)
    for study in ("seg", "fets", "xcal"):
        for job in grid.jobs(study):
            assert wildcards_from_path(study, f"/tmp/w/{job.path}/x.csv") == job.wc
    with pytest.raises(ValueError, match="not inside a seg job folder"):
        wildcards_from_path("seg", "results/seg/duke/unet/flat")


def test_key_order_does_not_change_job_params(smoke):
    shuffled = yaml.safe_load(yaml.safe_dump(smoke, sort_keys=True))
    reordered = {key: shuffled[key] for key in reversed(list(shuffled))}
    first = check_config(smoke, SCHEMA)
    second = check_config(reordered, SCHEMA)
    for study in ("seg", "fets", "xcal"):
        assert [repr(job.params) for job in first.jobs(study)] == [
            repr(job.params) for job in second.jobs(study)
        ]
    assert repr(smoke["data"]) == repr(reordered["data"])


def test_paper_config_runs_at_least_three_seeds_per_block():
    """Every block of every study's paper grid runs ≥ 3 seeds, so every table can give an
    interval over seeds."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for study in ("seg", "fets", "xcal"):
        for index, block in enumerate(config[study]["grid"]):
            assert len(set(block["seeds"])) >= 3, f"{study}.grid[{index}]"


def test_synthetic_structure_scales_default_to_one_and_are_validated(smoke):
    smoke["data"]["umn"]["synthetic"].pop("fluid_scale", None)
    smoke["data"]["covidct"]["synthetic"].pop("lesion_scale", None)
    check_config(smoke, SCHEMA)
    assert smoke["data"]["umn"]["synthetic"]["fluid_scale"] == 1.0
    assert smoke["data"]["covidct"]["synthetic"]["lesion_scale"] == 1.0
    for dataset, key in (("umn", "fluid_scale"), ("covidct", "lesion_scale")):
        for bad in (0, -1.0, 10.0, "big"):
            broken = load("smoke.yaml")
            broken["data"][dataset]["synthetic"][key] = bad
            with pytest.raises(WorkflowError, match=key):
                check_config(broken, SCHEMA)
