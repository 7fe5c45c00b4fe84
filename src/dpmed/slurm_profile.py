"""Install dpmed's SLURM site profile where `snakemake --profile slurm` finds it.

Snakemake looks a profile name up in the current folder, then in the user's config folder
(`$XDG_CONFIG_HOME/snakemake`, by default `~/.config/snakemake`), then `/etc/xdg/snakemake`.
`make slurm-profile` copies `profiles/slurm-template/` to `<user config>/snakemake/slurm/`, fills
in the site values it is given, never overwrites an existing profile, and says what is left to
edit. Standard library only: it runs on a login node before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

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
