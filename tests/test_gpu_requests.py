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
from conftest import REPO, SMOKE_CONFIG, site_slurm_profile
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


@pytest.mark.parametrize(
    "configfile",
    [SMOKE_CONFIG, pytest.param(PAPER_CONFIG, marks=pytest.mark.slow)],
    ids=["smoke", "paper"],
)
def test_each_gpu_job_makes_one_gpu_request_with_and_without_a_gpu_model(tmp_path, configfile):
    settings = gpu_model_settings()
    assert {"gpu_model": "a100"} in settings  # the template documents how to ask for a model
    wrong = []  # (setting, rule, sbatch GPU arguments) of each job that asks wrongly
    # Which GPU a job asks for comes from the profile, not the grid: the paper grid is checked
    # with the template as installed, the smoke grid with each documented setting too.
    for n, setting in enumerate([{}, *settings] if configfile == SMOKE_CONFIG else [{}]):
        profile = profile_with(tmp_path / f"profile{n}", setting)
        covered = set()
        for preflight in (False, True):
            with profiled_workflow(profile, configfile, tmp_path / "work", preflight=preflight,
                                   **ON_GPUS) as workflow:  # fmt: skip
                gpu_rules = {r.name for r in workflow.rules if r.resources.get("gpu") == 1}
                first = {}
                for job in planned_jobs(workflow):
                    first.setdefault(job.rule.name, job)
                for rule in gpu_rules & set(first):
                    arguments = set_gres_string(first[rule])
                    model = setting.get("gpu_model")
                    if len(gpu_requests(arguments)) != 1 or (
                        model and f"--gpus={model}:1" not in arguments
                    ):
                        wrong.append((setting, rule, arguments))
                    covered.add(rule)
        assert covered == gpu_rules == {"seg_train", "seg_attack", "fets_train", "xcal_train",
                                        "privacy_audit", "preflight"}  # fmt: skip
    assert not wrong, "\n".join(map(str, wrong))


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
