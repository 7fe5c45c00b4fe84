"""The xcal Flower app's run config: one xcal job as the flat key = value pairs of
`[tool.flwr.app.config]` (deploy/flower/pyproject.toml), which `flwr run --run-config` overrides
key by key or with a TOML file of them.

Keys: the cell's wildcards (`WILDCARDS`, e.g. `eps = "5"`); every xcal hyperparameter under its
config name (config/schema.yaml's `xcal_params`), a list as space-separated numbers
(`brightness = "0.6 1.4"`) and each signal preset as `presets.<name> = "1 1 1"`; and the
deployment keys (`DEPLOYMENT`). The job's run folder is <out>/<the cell's run path>, as the
workflow names it under results/. `dpmed flower-config` writes the run config of a grid cell.
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpmed.config.wildcards import format_eps
from dpmed.install import workflow_file
from dpmed.runtime import JobContext
from dpmed.xcal.spec import SPEC

SMOKE_CONFIG = workflow_file("config/smoke.yaml")
SMOKE_RUNS = [
    f"results/xcal/bloodmnist/resnet18/{method}/iid/c3/eps5/seed0" for method in ("xcal", "static")
]
UserValue = bool | float | int | str  # what a Flower run config holds
WILDCARDS = tuple(wc for _, wc in SPEC.axes)
# The deployment keys (deploy/flower/pyproject.toml documents them and holds their defaults).
DEPLOYMENT = ("processed", "out", "device", "round-timeout", "connect-timeout", "simulation-seeds")
INTEGER = re.compile(r"[+-]?[0-9]+")


def app_defaults() -> dict[str, UserValue]:
    """The app's default run config (deploy/flower/pyproject.toml's `[tool.flwr.app.config]`,
    flattened as Flower flattens it)."""
    from flwr.common.config import flatten_dict

    pyproject = tomllib.loads((workflow_file("deploy/flower") / "pyproject.toml").read_text())
    return flatten_dict(pyproject["tool"]["flwr"]["app"]["config"])


def param_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the `xcal_params` schema, the `$defs` its references resolve in), as the config check
    loads them (registered names filled in)."""
    from dpmed.config.checks import load_schema

    defs = load_schema(workflow_file("config/schema.yaml"))["$defs"]
    return defs["xcal_params"], defs


def numbers(text: str) -> list[int | float]:
    """Parse "0.6 1.4" as [0.6, 1.4]; integers stay int, so a list round-trips exactly."""
    return [int(t) if INTEGER.fullmatch(t) else float(t) for t in str(text).split()]


def spelled(values: Sequence[int | float]) -> str:
    """[0.6, 1.4] → "0.6 1.4" (`numbers`' inverse)."""
    return " ".join(repr(v) for v in values)


def run_path(wildcards: Mapping[str, str]) -> Path:
    """The cell's run path, e.g. results/xcal/bloodmnist/resnet18/xcal/iid/c3/eps5/seed0."""
    return Path(SPEC.path.format(**wildcards))


def run_config(job: JobContext, **deployment: UserValue) -> dict[str, UserValue]:
    """The run config of `job` (paths absolute; `out`: the run folder less the cell's run path;
    the app's defaults for the other `DEPLOYMENT` keys), `deployment` keys replacing any of
    them."""
    from dpmed.config.grid import job_seed

    if job.seed != job_seed("xcal", job.wildcards):  # the run config's job derives it
        raise ValueError(f"job seed {job.seed} is not the cell's {job_seed('xcal', job.wildcards)}")
    run, out = run_path(job.wildcards).parts, Path(job.out_dir).parts
    if out[-len(run) :] != run:
        raise ValueError(f"run folder {job.out_dir} is not <out>/{run_path(job.wildcards)}")
    schema, _ = param_schema()
    config: dict[str, UserValue] = {wc: str(job.wildcards[wc]) for wc in WILDCARDS}
    for key, value in job.params.items():
        if key == "presets":
            config.update({f"presets.{name}": spelled(v) for name, v in value.items()})
        elif schema["properties"][key].get("type") == "array":
            config[key] = spelled(value)
        else:
            config[key] = value
    defaults = app_defaults()
    config.update({key: defaults[key] for key in DEPLOYMENT})
    config["processed"] = str(Path(job.processed_dir).resolve())
    config["out"] = str((Path(*out[: -len(run)]) if len(out) > len(run) else Path(".")).resolve())
    return {**config, "device": job.device, **deployment}


def wildcard(name: str, value: UserValue) -> str:
    """A run-config value as the cell's wildcard (ε spelled as in run paths); ValueError naming
    the key unless it matches the study's pattern."""
    text = str(value)
    if name == "eps" and re.fullmatch(SPEC.patterns[name], text.lower()):
        text = format_eps(text.lower())  # 5.0 or "5.0": the run path's eps5
    if not re.fullmatch(SPEC.patterns[name], text):
        raise ValueError(f"run config {name} = {value!r} is not a valid xcal {name}")
    return text


def params(config: Mapping[str, UserValue]) -> dict[str, Any]:
    """The hyperparameters the run config holds, checked against the config schema (a
    ValueError names the key at fault)."""
    import jsonschema

    schema, defs = param_schema()
    values: dict[str, Any] = {"presets": {}}
    for key, value in config.items():
        if key.startswith("presets."):
            values["presets"][key.removeprefix("presets.")] = numbers(str(value))
        elif key in schema["properties"]:
            array = schema["properties"][key].get("type") == "array"
            values[key] = numbers(str(value)) if array else value
    try:
        jsonschema.validate(values, {**schema, "$defs": defs})
    except jsonschema.ValidationError as err:
        where = ".".join(str(p) for p in err.absolute_path) or "hyperparameters"
        raise ValueError(f"run config {where}: {err.message}") from None
    return values


def processed_dir(config: Mapping[str, UserValue]) -> Path:
    """The processed data folder the run config names (`processed`, else <out>/data/processed,
    where `server_job` generates the synthetic data)."""
    processed = str(config["processed"])
    return Path(processed) if processed else Path(str(config["out"])) / "data" / "processed"


def job_from_run_config(config: Mapping[str, UserValue]) -> JobContext:
    """The JobContext of the run config `config` (relative paths stay relative to the folder
    the app runs in)."""
    from dpmed.config.grid import job_seed

    wildcards = {name: wildcard(name, config[name]) for name in WILDCARDS}
    return JobContext(
        processed_dir=processed_dir(config),
        out_dir=Path(str(config["out"])) / run_path(wildcards),
        wildcards=wildcards,
        params=params(config),
        seed=job_seed("xcal", wildcards),
        device=str(config["device"]),
        threads=1,
    )


def server_job(config: Mapping[str, UserValue]) -> JobContext:
    """`job_from_run_config`, generating the smoke config's synthetic data of the dataset in
    <out>/data first when `processed` is empty."""
    job = job_from_run_config(config)
    if not str(config["processed"]):
        from dpmed.config.checks import load_configs

        smoke = load_configs([SMOKE_CONFIG])
        synthetic_data(smoke, {job.wildcards["dataset"]}, Path(job.processed_dir).parent)
    return job


def toml_text(config: Mapping[str, UserValue]) -> str:
    """`config` as a TOML file `flwr run --run-config` reads (one key = value a line; a JSON
    string is a TOML string, a Python number's repr a TOML number)."""
    return "".join(
        f"{key} = {json.dumps(v) if isinstance(v, str) else repr(v)}\n" for key, v in config.items()
    )


def write_run_config(path: Path, job: JobContext, **deployment: UserValue) -> Path:
    """Write `job`'s run config (`run_config`) to the TOML file `path`; returns `path`."""
    from dpmed.io import write_text

    write_text(path, toml_text(run_config(job, **deployment)))
    return Path(path)


def xcal_jobs(
    config_files: Sequence[Path],
    runs: Sequence[str],
    processed: Path | None,
    out: Path,
    device: str,
) -> list[JobContext]:
    """The JobContexts the workflow would give the xcal jobs whose run folders are `runs`, each
    writing to out/<run>. Without `processed`, the config's synthetic data of the runs' dataset
    are generated under out/data (as the data stage would)."""
    from dpmed.config.checks import check_config, load_configs
    from dpmed.config.grid import job_seed, wildcards_from_path

    config = load_configs(config_files)
    grid = check_config(config, workflow_file("config/schema.yaml"), config_files)
    wildcards = [wildcards_from_path("xcal", run) for run in runs]
    if processed is None:
        processed = synthetic_data(config, {wc["dataset"] for wc in wildcards}, out / "data")
    return [
        JobContext(
            processed,
            out / run,
            wc,
            grid.params("xcal", wc),
            job_seed("xcal", wc),
            device=device,
            threads=1,
        )  # fmt: skip
        for run, wc in zip(runs, wildcards, strict=True)
    ]


def synthetic_data(config: dict[str, Any], datasets: set[str], root: Path) -> Path:
    """Generate and process the config's synthetic data of the one dataset in `datasets`."""
    from dpmed.data.stage import synthetic_processed

    if len(datasets) != 1:
        raise SystemExit(f"the runs of one federation read one dataset, not {sorted(datasets)}")
    (dataset,) = datasets
    return synthetic_processed(dataset, config["data"][dataset], root)


def main(argv: Sequence[str] | None = None) -> None:
    """`dpmed flower-config`: print (or write) the run config of one xcal cell."""
    parser = argparse.ArgumentParser(
        prog="dpmed flower-config",
        description="The Flower run config (TOML) of an xcal grid cell, for "
        "`flwr run deploy/flower <federation> --run-config FILE`.",
    )
    parser.add_argument(
        "--config", nargs="+", type=Path, default=[SMOKE_CONFIG],
        help="config file(s), merged in order (default config/smoke.yaml)",
    )  # fmt: skip
    parser.add_argument(
        "--run", default=SMOKE_RUNS[0],
        help=f"the cell's run folder path (default {SMOKE_RUNS[0]})",
    )  # fmt: skip
    parser.add_argument(
        "--processed", type=Path,
        help="processed dataset folder on the server's machine (default: the config's "
        "synthetic data, generated now in <out>/data)",
    )  # fmt: skip
    defaults = app_defaults()
    parser.add_argument("--out", type=Path, default=Path(str(defaults["out"])))
    parser.add_argument("--device", default=defaults["device"], help="the server's torch device")
    parser.add_argument("--round-timeout", type=float, default=defaults["round-timeout"])
    parser.add_argument("--connect-timeout", type=float, default=defaults["connect-timeout"])
    parser.add_argument("--write", type=Path, help="write the TOML file here (default: print)")
    args = parser.parse_args(argv)
    (job,) = xcal_jobs(args.config, [args.run], args.processed, args.out, args.device)
    timeouts = {"round-timeout": args.round_timeout, "connect-timeout": args.connect_timeout}
    if args.write:
        print(write_run_config(args.write, job, **timeouts))
    else:
        print(toml_text(run_config(job, **timeouts)), end="")
