"""What the site profile makes of dpmed's jobs, checked when the workflow loads.

The SLURM executor plugin builds a job's GPU request from three resources: `gpu` (→ `--gpus=N`),
`gpu_model` (→ `--gpus=<model>:N`) and `gres` (→ `--gres=...`, added beside the others). dpmed's
GPU rules declare `gpu`, so a profile that also sets a GPU `gres` makes two GPU requests on one
job, and a `gpu_model` on a rule without `gpu` asks a light job for a GPU. Both are errors here,
raised before any job is planned. A `<...>` placeholder of profiles/slurm-template left in the
profile in use plans fine but cannot submit: it is named in a warning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from dpmed.slurm_profile import PLACEHOLDER

GPU_KEYS = ("gpu", "gpu_model", "gres")
HOW_TO = (
    "Ask for a GPU model with `gpu_model: <model>` under set-resources of each GPU rule "
    "(→ --gpus=<model>:1), never with a GPU `gres`, nor in default-resources "
    "(profiles/slurm-template/config.yaml)."
)


class SiteProfileError(ValueError):
    """The profile in use would make the plugin ask wrongly for GPUs; names each rule."""


def static_value(resource: Any) -> Any:
    """The value of a Snakemake `Resource` known before any job exists: a constant, or the text a
    profile gave (Snakemake keeps it as `raw` and evaluates it per job); None for a function."""
    if not resource.is_evaluable():
        return resource.value
    return resource.raw if isinstance(resource.raw, str) else None


def gpu_arguments(resources: Mapping[str, Any]) -> list[str]:
    """The sbatch arguments the SLURM executor plugin's own `set_gres_string` builds from a job's
    GPU `resources` (gpu, gpu_model, gres)."""
    from snakemake.iocontainers import ResourceList
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = SimpleNamespace(resources=ResourceList(fromdict=dict(resources)))
    return set_gres_string(job).split()


def is_gpu_request(argument: str) -> bool:
    """Whether an sbatch argument asks for GPUs (`--gpus=...`, or `--gres=` naming a gpu)."""
    return argument.startswith("--gpus") or (argument.startswith("--gres") and "gpu" in argument)


def gpu_request_errors(rules: Iterable[Any]) -> list[str]:
    """One line per Snakemake rule whose resources (its own, with the profile's default- and
    set-resources merged in) make the plugin ask for two GPU requests, or for a GPU model on a job
    that asks for no GPU. Rules whose GPU resources are functions of the job are not judged."""
    errors = []
    for rule in rules:
        given = {k: static_value(r) for k, r in rule.resources.items() if k in GPU_KEYS}
        if not (given.get("gres") or given.get("gpu_model")) or None in given.values():
            continue  # at most `--gpus=N`, or only a job can tell
        requests = [a for a in gpu_arguments(given) if is_gpu_request(a)]
        if len(requests) > 1:
            errors.append(f"rule {rule.name}: {' '.join(requests)} (two GPU requests on one job)")
        elif given.get("gpu_model") and not given.get("gpu"):
            errors.append(f"rule {rule.name}: {' '.join(requests)} on a job that needs no GPU")
    return errors


def check_gpu_requests(rules: Iterable[Any]) -> None:
    """Raise SiteProfileError naming every rule of `gpu_request_errors`."""
    errors = gpu_request_errors(rules)
    if errors:
        lines = "\n".join(f"  {e}" for e in errors)
        raise SiteProfileError(f"dpmed: the profile's GPU requests are wrong:\n{lines}\n{HOW_TO}")


def profile_placeholders(resource_settings: Any) -> list[str]:
    """One line per resource and `<...>` placeholder still in the default-resources or
    set-resources that Snakemake was given (its `workflow.resource_settings`), naming where."""
    from snakemake.resources import Resources

    sections = {"default-resources": resource_settings.default_resources or {}}
    sections |= {f"set-resources {rule}": res for rule, res in
                 resource_settings.overwrite_resources.items()}  # fmt: skip
    places: dict[tuple[str, str], list[str]] = {}
    for section, resources in sections.items():
        for name, resource in Resources.from_mapping(resources).items():
            value = static_value(resource)
            for placeholder in PLACEHOLDER.findall(value if isinstance(value, str) else ""):
                places.setdefault((name, placeholder), []).append(section)
    return [f"the profile's {name} is still {placeholder} ({', '.join(found)}): fill it in"
            for (name, placeholder), found in places.items()]  # fmt: skip
