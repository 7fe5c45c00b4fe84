"""What `snakemake --profile slurm` submits for dpmed's GPU jobs, without a cluster: the site
profile (profiles/slurm-template, installed as `make slurm-profile` does) is read by Snakemake's
own command-line parser, the workflow's jobs are built in this process, and the SLURM executor
plugin's own `set_gres_string` turns each GPU job's resources into its sbatch arguments.

Each GPU job must carry exactly one GPU request (`--gpus=...` or `--gres=gpu...`), with the
template as installed and with each GPU-model setting its comments document; a profile that would
make two is refused when the workflow loads, naming the rule."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG, TRAINING_RULES, site_slurm_profile
from snakemake_executor_plugin_slurm.utils import set_gres_string

from dpmed.slurm_profile import SiteProfileError, install

TEMPLATE = REPO / "profiles" / "slurm-template" / "config.yaml"
PAPER_CONFIG = REPO / "config" / "config.yaml"
ON_GPUS = {"device": "auto"}  # the grids as a GPU cluster runs them
GPU_KEYS = ("gpu", "gpu_model", "gres")


@contextlib.contextmanager
def profiled_workflow(profile: Path, configfile: Path, workdir: Path, **config: Any) -> Iterator:
    """The Snakemake `Workflow` of the Snakefile with `configfile` (and `config` overrides) and the
    default- and set-resources Snakemake's own parser reads from the site profile `profile`."""
    from snakemake.api import SnakemakeApi
    from snakemake.cli import parse_args
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        OutputSettings,
        ResourceSettings,
        StorageSettings,
    )

    _, args = parse_args(["--profile", str(profile)])
    resources = ResourceSettings(
        default_resources=args.default_resources, overwrite_resources=args.set_resources
    )
    with SnakemakeApi(OutputSettings(quiet=None)) as api:
        workflow_api = api.workflow(
            resource_settings=resources,
            config_settings=ConfigSettings(configfiles=[configfile], config=config),
            storage_settings=StorageSettings(),
            snakefile=REPO / "Snakefile",
            workdir=workdir,
        )
        workflow_api.dag(DAGSettings(forceall=True))
        yield workflow_api._workflow


def planned_jobs(workflow) -> list:
    """Every job of the workflow's DAG (as `snakemake -n --forceall` plans it)."""
    workflow._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
    workflow._build_dag()
    return list(workflow.dag.jobs)


def gpu_model_settings() -> list[dict[str, str]]:
    """Each way the template's comments tell a site to ask for a GPU model, e.g.
    `# gpu_model: "a100"`: one setting per commented GPU resource."""
    found = re.findall(r'^\s*#\s*(gpu_model|gres|gpu):\s*"([^"]+)"', TEMPLATE.read_text(), re.M)
    return [{key: value} for key, value in found]


def profile_with(root: Path, setting: dict[str, Any], section: str = "set-resources") -> Path:
    """The installed site profile with `setting` added to each rule of its set-resources (or to
    `section`: a rule's name, or default-resources)."""
    profile = site_slurm_profile(root)
    text = yaml.safe_load((profile / "config.yaml").read_text())
    if section == "set-resources":
        for resources in text[section].values():
            resources.update(setting)
    elif section == "default-resources":
        text[section].update(setting)
    else:
        text["set-resources"][section] = {**text["set-resources"][section], **setting}
    (profile / "config.yaml").write_text(yaml.safe_dump(text))
    return profile


def gpu_requests(sbatch_arguments: str) -> list[str]:
    return re.findall(r"--gpus[=\s]\S+|--gres[=\s]\S*gpu\S*", sbatch_arguments)


GPU_RULES = {*TRAINING_RULES, "privacy_audit", "preflight"}


def gpu_plan(profile: Path, configfile: Path, workdir: Path, setting: dict) -> dict[str, Any]:
    """The grid of `configfile` as a GPU cluster plans it with the site profile `profile` (which
    sets `setting`), with and without `preflight`: the rules covered (the GPU rules with a
    job), the wrong requests ((setting, rule, sbatch GPU arguments) of each GPU rule's first job
    that does not make exactly one GPU request, of the set model if any) and the training
    jobs' (rule, wildcards, resources)."""
    plan: dict[str, Any] = {"covered": set(), "wrong": [], "training": [], "rules": set()}
    for preflight in (False, True):
        with profiled_workflow(profile, configfile, workdir, preflight=preflight,
                               **ON_GPUS) as workflow:  # fmt: skip
            gpu_rules = {r.name for r in workflow.rules if r.resources.get("gpu") == 1}
            assert gpu_rules == GPU_RULES
            first = {}
            for job in planned_jobs(workflow):
                first.setdefault(job.rule.name, job)
                plan["rules"].add(job.rule.name)
                if job.rule.name in TRAINING_RULES and not preflight:
                    plan["training"].append((job.rule.name, dict(job.wildcards_dict),
                                             dict(job.resources.items())))  # fmt: skip
            for rule in gpu_rules & set(first):
                arguments = set_gres_string(first[rule])
                model = setting.get("gpu_model")
                if len(gpu_requests(arguments)) != 1 or (
                    model and f"--gpus={model}:1" not in arguments
                ):
                    plan["wrong"].append((setting, rule, arguments))
                plan["covered"].add(rule)
    return plan


@pytest.fixture(scope="module")
def paper_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`gpu_plan` of the paper grid with the template as installed: the suite's one plan of
    the paper grid (the command line's dry runs and the local profile are checked on the
    smoke grid, e.g. test_profiles.py)."""
    root = tmp_path_factory.mktemp("paper")
    return gpu_plan(profile_with(root, {}), PAPER_CONFIG, root / "work", {})


def test_each_gpu_job_makes_one_gpu_request_with_and_without_a_gpu_model(tmp_path):
    """The smoke grid with the template as installed and with each documented setting."""
    settings = gpu_model_settings()
    assert {"gpu_model": "a100"} in settings  # the template documents how to ask for a model
    for n, setting in enumerate([{}, *settings]):
        profile = profile_with(tmp_path / f"profile{n}", setting)
        plan = gpu_plan(profile, SMOKE_CONFIG, tmp_path / "work", setting)
        assert plan["covered"] == GPU_RULES
        assert not plan["wrong"], "\n".join(map(str, plan["wrong"]))


@pytest.mark.slow
def test_each_gpu_job_of_the_paper_grid_makes_one_gpu_request(paper_plan):
    """Which GPU a job asks for comes from the profile, not the grid: the paper grid is checked
    with the template as installed."""
    assert paper_plan["covered"] == GPU_RULES
    assert not paper_plan["wrong"], "\n".join(map(str, paper_plan["wrong"]))


@pytest.mark.slow
def test_every_paper_job_asks_slurm_for_what_the_cost_model_predicts(paper_plan):
    """Every training job of the paper grid goes to the GPU partition with one GPU and the
    memory and runtime `dpmed.job_cost.request` gives it on a GPU."""
    from dpmed import job_cost
    from dpmed.config.checks import check_config, load_config_file

    config = load_config_file(PAPER_CONFIG)
    grid = check_config(config, REPO / "config" / "schema.yaml")
    jobs = paper_plan["training"]
    assert {rule for rule, _, _ in jobs} == set(TRAINING_RULES)
    assert {"all", "claims", "privacy_audit", "preflight"} <= paper_plan["rules"]
    for rule, wc, resources in jobs:
        assert (resources["gpu"], resources["slurm_partition"]) == (1, "gpu"), (rule, wc)
        study = rule.partition("_")[0]
        want = job_cost.request(rule, config, wc, grid.params(study, wc), gpu=True)
        assert (resources["mem_mb"], resources["runtime"]) == (want.mem_mb, want.runtime), (
            rule, wc, resources)  # fmt: skip


def test_every_gpu_rule_goes_to_the_templates_gpu_partition(tmp_path):
    """Iterates over the parsed workflow's rules, so a new study's GPU rule is covered."""
    with profiled_workflow(site_slurm_profile(tmp_path), SMOKE_CONFIG, tmp_path / "work",
                           **ON_GPUS) as workflow:  # fmt: skip
        rules = {r.name: r.resources for r in workflow.rules}
    gpu_rules = {name for name, res in rules.items() if "gpu" in res}
    assert {"seg_train", "fets_train", "xcal_train", "privacy_audit", "preflight"} <= gpu_rules
    for name, resources in rules.items():
        partition = resources["slurm_partition"].raw  # as the profile gave it
        assert partition == ("gpu" if name in gpu_rules else "cpu"), name


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"gres": "gpu:a100:1"}, "--gres=gpu:a100:1 --gpus=1 (two GPU requests on one job)"),
        ({"gpu_model": "a100", "gres": "gpu:a100:1"}, "--gres=gpu:a100:1 --gpus=a100:1 (two"),
    ],
)
def test_a_profile_making_two_gpu_requests_is_refused_at_load_naming_the_rule(
    tmp_path, setting, message
):
    profile = profile_with(tmp_path, setting, section="fets_train")
    with pytest.raises(Exception) as caught:
        with profiled_workflow(profile, SMOKE_CONFIG, tmp_path / "work", **ON_GPUS):
            pass
    error = caught.value if isinstance(caught.value, SiteProfileError) else caught.value.__cause__
    assert isinstance(error, SiteProfileError), repr(caught.value)
    assert f"rule fets_train: {message}" in str(error)
    assert "rule seg_train:" not in str(error)


def test_a_gpu_model_for_every_job_is_refused_naming_the_light_rules(tmp_path):
    """default-resources reach every rule: the plugin would ask each light job for a GPU."""
    profile = profile_with(tmp_path, {"gpu_model": "a100"}, section="default-resources")
    with pytest.raises(Exception) as caught:
        with profiled_workflow(profile, SMOKE_CONFIG, tmp_path / "work", **ON_GPUS):
            pass
    assert "rule datasets_table: --gpus=a100:1 on a job that needs no GPU" in str(caught.value)
    assert "rule seg_train:" not in str(caught.value)


def test_the_workflow_warns_once_per_unfilled_placeholder_of_the_profile(tmp_path, capfd):
    unfilled = tmp_path / "unfilled"
    install(TEMPLATE.parent, unfilled, {})
    every = {"<account>", "<cpu-partition>", "<gpu-partition>"}
    for profile, want in [(site_slurm_profile(tmp_path), set()), (unfilled, every)]:
        capfd.readouterr()
        with profiled_workflow(profile, SMOKE_CONFIG, tmp_path / "work", **ON_GPUS):
            pass
        warnings = [w for w in capfd.readouterr().err.splitlines() if "dpmed warning" in w]
        assert {p for w in warnings for p in re.findall(r"<[a-z-]+>", w)} == want, warnings
        assert len(warnings) == len(want), warnings
