"""Install dpmed's SLURM site profile where `snakemake --profile slurm` finds it, and check what
the profile in use makes of dpmed's jobs when the workflow loads.

Snakemake looks a profile name up in the current folder, then in the user's config folder
(`$XDG_CONFIG_HOME/snakemake`, by default `~/.config/snakemake`), then `/etc/xdg/snakemake`.
`make slurm-profile` copies `profiles/slurm-template/` to `<user config>/snakemake/slurm/`, fills
in the site values it is given, never overwrites an existing profile, and says what is left to
edit. Standard library only at import (the checks import Snakemake when called): it runs on a
login node before anything is installed.

The SLURM executor plugin builds a job's GPU request from three resources: `gpu` (→ `--gpus=N`),
`gpu_model` (→ `--gpus=<model>:N`) and `gres` (→ `--gres=...`, added beside the others). dpmed's
GPU rules declare `gpu`, so a profile that also sets a GPU `gres` makes two GPU requests on one
job, and a `gpu_model` on a rule without `gpu` asks a light job for a GPU. Both are errors
(`check_gpu_requests`), raised before any job is planned. A `<...>` placeholder of
profiles/slurm-template left in the profile in use plans fine but cannot submit: it is named in
a warning (`profile_placeholders`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dpmed.install import workflow_file

PLACEHOLDER = re.compile(r"<[a-z][a-z-]*>")
# Command-line option → the placeholder it fills.
OPTIONS = {"account": "<account>", "cpu_partition": "<cpu-partition>",
           "gpu_partition": "<gpu-partition>"}  # fmt: skip


def user_profile_dir(name: str = "slurm", env: Mapping[str, str] | None = None) -> Path:
    """The folder Snakemake reads for `--profile <name>` from the user's config (as platformdirs
    resolves it on Linux: a non-empty XDG_CONFIG_HOME, else ~/.config)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME", "").strip() or str(Path(env.get("HOME", "~")) / ".config")
    return Path(base).expanduser() / "snakemake" / name


def install(template: Path, dest: Path, values: Mapping[str, str]) -> dict[Path, list[str]]:
    """Copy the profile folder `template` to `dest`, replacing each placeholder of `values`
    (e.g. {"<account>": "proj42"}) in its YAML files; return each installed file that still holds
    placeholders outside comments, with them.

    Raises FileExistsError when `dest` exists: a site profile is the user's, never overwritten.
    """
    if dest.exists():
        raise FileExistsError(f"{dest} already exists; dpmed does not overwrite a site profile")
    shutil.copytree(template, dest)
    left = {}
    for path in sorted(dest.glob("*.yaml")):
        text = path.read_text()
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        path.write_text(text)
        if found := sorted(set(PLACEHOLDER.findall(_uncommented(text)))):
            left[path] = found
    return left


def _uncommented(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", type=Path, default=workflow_file("profiles/slurm-template"))
    parser.add_argument(
        "--dest", type=Path, default=None, help="default: " + str(user_profile_dir())
    )
    for option in OPTIONS:
        parser.add_argument("--" + option.replace("_", "-"), default="")
    args = parser.parse_args(argv)
    dest = args.dest or user_profile_dir()
    values = {OPTIONS[o]: getattr(args, o) for o in OPTIONS if getattr(args, o)}
    try:
        left = install(args.template, dest, values)
    except FileExistsError as err:
        print(f"slurm-profile: {err}. Edit it, or move it away and rerun.", file=sys.stderr)
        return 1
    print(f"slurm-profile: installed {dest}/config.yaml")
    for path, placeholders in left.items():
        for placeholder in placeholders:
            print(f"slurm-profile: warning: {path} still holds {placeholder}: fill it in",
                  file=sys.stderr)  # fmt: skip
    if left:
        print(
            "slurm-profile: (or remove it and rerun with ACCOUNT=... CPU_PARTITION=... "
            "GPU_PARTITION=...)",
            file=sys.stderr,
        )
    print(
        "Then, from the project root:  snakemake --profile slurm -n   (the plan), and without -n."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
