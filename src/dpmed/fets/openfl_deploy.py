"""DP-SimAgg in a real OpenFL 1.9 federation on one machine: an aggregator process and one
collaborator process per FeTS partition, over gRPC with the aggregator listening on 127.0.0.1
only (TLS off: an `INSECURE` warning on every start), started with OpenFL's own `fx` commands
from the workspace template deploy/openfl/.

    dpmed fl-openfl --out DIR [--processed PROC] [--partitions 1,2,3] [--config FILE ...]
        [--set rounds=2 ...] [--aggregator dp_simagg] [--dpmode sound] [--eps 1] [--seed 0]
        [--seeded] [--timeout S] [--round-timeout S]

Every `--set KEY=VALUE` (a `fets.defaults` key), `--eps`, `--dpmode` and `--seed` is checked
first as the workflow checks a config, the cell appended to the config's fets grid; a bad value
stops the launcher naming its key. The layout is `dpmed fl-flower`'s: DIR/openfl is the
launch's folder (`dpmed.federation_processes`: one launch per folder, processes.json, logs/,
SIGTERM/SIGINT, exit status) and DIR/<run> the run's outputs, <run> the fets job's folder
(results/fets/<aggregator>/<dpmode>/eps<eps>/seed<seed>); without --processed the config's
synthetic FeTS data are generated under DIR/data.

Steps, as OpenFL's users run a federation: each partition's subjects become a site folder
(DIR/openfl/sites/<id>); the workspace is copied to DIR/openfl/workspace, its plan filled with
the fets job's parameters, common seeds and a free port, and its requirements.txt with this
dpmed's version; `fx plan initialize` writes the initial model; `fx workspace export` packs the
workspace and each site imports it (DIR/openfl/imports/<id>); then `fx aggregator start` and
`fx collaborator start -n <id>` in each import run until the aggregator ends. OpenFL 1.9 waits
for every collaborator of a round forever, so the federation stops with an error naming the
cause: a collaborator that died, a round not ended `--round-timeout` s after it began
(`openfl_components.FetsAggregator` names who has not reported), a round's upload lacking a
tensor of the model or holding one it lacks (a tensor of another shape or with a non-finite
entry is screened as a zero update instead), the `--timeout`, or a signal. The outputs are
written in each case.

Outputs in DIR/<run>: model.pt (the last released global model), rounds.csv (`rounds_frame`),
privacy.json (`dpmed.fets.privacy.privacy_record` over the released rounds, its `not_covered`
the run's other files and the launch's, plus `extra.deployment`: engine, rounds planned,
released and not released, status). Rounds count from 1 as in `dpmed.fets.run` (OpenFL's round
r is round r + 1 here); a progress line per round gives its model's Dice and the ε spent once
the collaborators have validated it. `--seeded` seeds the server's noise with the job seed, as
the simulation does (tests); without it the noise comes from OS entropy.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

import dpmed
from dpmed import federation_processes as fp
from dpmed.config.checks import check_config, load_configs
from dpmed.config.grid import common_seed, job_seed
from dpmed.config.wildcards import parse_eps
from dpmed.data import fets
from dpmed.data.stage import synthetic_processed
from dpmed.errors import ConfigError
from dpmed.fets import privacy
from dpmed.fets.aggregation import DP_MODES, aggregators
from dpmed.fets.grid import server_config
from dpmed.fets.server import ServerConfig
from dpmed.fets.spec import SPEC
from dpmed.install import workflow_file
from dpmed.io import write_csv
from dpmed.runtime import Progress

TEMPLATE = workflow_file("deploy/openfl")
ENGINE = "OpenFL 1.9 (TaskRunner API, gRPC)"
TASK_RUNNER_KEYS = ("base_filters", "depth", "norm", "local_epochs", "lr", "batch_size",
                    "patch_size", "patches_per_subject", "hd95")  # fmt: skip
# openfl_components' outputs
RECORDS, RELEASED, FAILURE = "dp_rounds.jsonl", "released_model.npz", "dp_failure.txt"
VALIDATION = "validation.jsonl"
LAUNCH = "openfl"  # the launch's folder in DIR
# What a run writes beside model.pt (its folder's files by name, the launch's by their path in
# DIR), and why the guarantee does not cover it.
NOT_COVERED = {
    "rounds.csv": "the Dice and HD95 scores of every round's global model, computed on the "
    "collaborators' own validation subjects without noise; chosen, the seeded, "
    "data-independent schedule, treated as public; rejected, the updates the server's screen "
    "rejected, read from the uploads without noise",
    "privacy.json": "extra.rejected_updates, the screen's rejections over the run, read from "
    "the uploads without noise; extra.deployment, how the run ended",
    f"{LAUNCH}/logs": "the processes' logs: the validation scores, the screen's warnings naming "
    "a rejected collaborator and tensor, timings",
    f"{LAUNCH}/processes.json": "the launch's status, error and wall-clock seconds (a side "
    "channel the guarantee does not model) and the processes' commands, ids, ports and exit codes",
    f"{LAUNCH}/workspace": "the aggregator's OpenFL workspace: the plan (with --seeded, the noise "
    "seed), workspace.zip, and in save/ the round records (dp_rounds.jsonl), the validation "
    "scores (validation.jsonl) and best.pbuf, the global model OpenFL kept for its best "
    "validation Dice, a choice made from those scores; the released models in save/ (init.pbuf, "
    "last.pbuf, released_model.npz) are covered",
    f"{LAUNCH}/imports": "each site's import of workspace.zip: the same plan",
    f"{LAUNCH}/sites": "the collaborators' data (their splits.csv rows, links to their "
    "subjects), what the guarantee protects; in a deployment it never leaves its site",
    f"{LAUNCH}/.lock": "the launcher's process id (one launch per folder)",
    "data": "the synthetic FeTS data the launcher generated (no --processed)",
}
RUN_OUTPUTS = ("model.pt", "rounds.csv", "privacy.json")


def subset_folder(processed: Path, folder: Path, partitions: Sequence[int]) -> Path:
    """A processed folder holding only `partitions`: their splits.csv rows and links to their
    subjects (one partition: what a hospital holds; all of them: the simulation's data)."""
    frame = fets.read_splits(processed)
    rows = frame[frame["partition_id"].isin(list(partitions))].reset_index(drop=True)
    missing = sorted(set(partitions) - set(rows["partition_id"]))
    if missing:
        raise ValueError(f"{processed}: no partitions {missing} in splits.csv")
    (folder / "subjects").mkdir(parents=True, exist_ok=True)
    write_csv(folder / "splits.csv", rows)
    for sid in rows["subject_id"]:
        for kind in ("image", "label"):
            link = folder / "subjects" / f"{sid}.{kind}.npy"
            if not link.exists():
                link.symlink_to((processed / "subjects" / link.name).resolve())
    return folder.resolve()


def fill_plan(plan: dict, params: Mapping[str, Any], wildcards: Mapping[str, str],
              cfg: ServerConfig, port: int, round_timeout: float = 600.0) -> dict:  # fmt: skip
    """The template plan with the job's rounds, training parameters, common seeds (init,
    local, schedule), DP settings, the aggregator's port and round timeout (s)."""
    plan["aggregator"]["settings"].update(rounds_to_train=int(params["rounds"]),
                                          round_timeout=float(round_timeout))  # fmt: skip
    runner = plan["task_runner"]["settings"]
    runner.update({key: params[key] for key in TASK_RUNNER_KEYS})
    runner["patch_size"] = [int(p) for p in params["patch_size"]]
    runner["init_seed"] = common_seed("fets", wildcards, "init")
    runner["local_seed"] = common_seed("fets", wildcards, "local")
    plan["network"]["settings"]["agg_port"] = port
    plan["assigner"]["settings"].update(
        participation=float(params["participation"]), selection_strategy=params["selection"],
        schedule_seed=common_seed("fets", wildcards, "schedule"),
    )  # fmt: skip
    plan["tasks"]["train"]["aggregation_type"]["settings"].update(
        aggregator=cfg.aggregator, epsilon0=cfg.epsilon0, delta0=cfg.delta0,
        clip_norm=cfg.clip_norm, mode=cfg.dpmode,
        calibration=cfg.sound_calibration, distance=cfg.simagg_distance, seed=cfg.seed,
    )  # fmt: skip
    return plan


def fill_requirements(text: str, version: str) -> str:
    """The template's requirements.txt with its dpmed line pinned to `version`."""
    pinned, found = re.subn(r"(?m)^dpmed\[fl\]==\S+.*$", f"dpmed[fl]=={version}", text)
    if found != 1:
        raise ValueError("requirements.txt: expected one `dpmed[fl]==` line to fill")
    return pinned


def make_workspace(workspace: Path, template: Path, plan: dict, sites: Mapping[str, Path]) -> None:
    """Copy the template, write the filled plan, plan/cols.yaml (the authorized collaborators),
    plan/data.yaml (`collaborator,data folder` lines, OpenFL's format) and requirements.txt
    pinning this dpmed's version."""
    shutil.copytree(template, workspace, ignore=shutil.ignore_patterns("__pycache__"))
    requirements = workspace / "requirements.txt"
    requirements.write_text(fill_requirements(requirements.read_text(), dpmed.__version__))
    (workspace / "save").mkdir(exist_ok=True)
    (workspace / "plan" / "plan.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    cols = yaml.safe_dump({"collaborators": list(sites)}, default_style=None)
    (workspace / "plan" / "cols.yaml").write_text(cols)
    (workspace / "plan" / "data.yaml").write_text("".join(f"{c},{p}\n" for c, p in sites.items()))


def fx_command(*args: str) -> list[str]:
    """OpenFL's `fx` of this Python environment."""
    return [str(Path(sys.executable).with_name("fx")), *args]


def run_federation(workspace: Path, record: fp.LaunchRecord, collaborators: Sequence[str],
                   port: int, timeout: float,
                   progress: Progress) -> fp.FederationProcessError | None:  # fmt: skip
    """Initialize and export the workspace, import it for each site (imports/<id> beside it),
    start the aggregator and the collaborators from their workspaces (each in `record`), wait
    until the aggregator ends, a process fails, `timeout` s pass or the launcher is signalled,
    printing a `progress` line per validated round; stop every process group. Returns the
    error, or None."""
    out = workspace.parent
    deadline = time.monotonic() + timeout
    imports = {c: out / "imports" / c for c in collaborators}
    printed = 0

    def report() -> None:
        """A `progress` line per released round once the collaborators validated its model (in
        the next OpenFL round): its Dice (whole tumour, mean over the labels) and the ε spent
        so far (the smaller of basic and RDP composition, as privacy.json states it)."""
        nonlocal printed
        records, scores = read_save(workspace / "save")
        while printed < len(records) and printed + 1 in scores:
            record, score = records[printed], scores[printed + 1]
            printed += 1
            dice = {"WT": score["dice_WT"], "dice": score["dice_mean_labels"]}
            progress.line(printed, dice, min(record["eps_basic_cum"], record["eps_rdp_cum"]))

    def started(name: str, args: Sequence[str], cwd: Path, **ports: int) -> fp.Process:
        log = out / "logs" / f"{name.replace('-', '_')}.log"
        return record.started(fp.start(name, fx_command(*args), log, cwd=cwd, ports=ports))

    def steps(*named: tuple[str, Sequence[str], Path]) -> None:
        """Run fx steps (name, arguments, folder) side by side; raise naming the first that
        failed."""
        for _, _, cwd in named:
            cwd.mkdir(parents=True, exist_ok=True)
        runs = [started(name, args, cwd) for name, args, cwd in named]
        fp.watch(lambda: not any(r.alive() for r in runs), deadline, f"fx step {named[0][0]}")
        failed = next((r for r in runs if r.popen.returncode != 0), None)
        if failed is not None:
            raise fp.FederationProcessError(
                f"fx step {failed.name} failed; log {failed.log_path}:\n{failed.log_tail()}"
            )

    try:
        archive = workspace / f"{workspace.name}.zip"  # where fx workspace export writes it
        steps(("plan-initialize", ["plan", "initialize"], workspace))
        steps(("workspace-export", ["workspace", "export"], workspace))
        steps(*[(f"workspace-import-{c}", ["workspace", "import", "--archive", str(archive)],
                 imports[c]) for c in collaborators])  # fmt: skip
        agg = started("aggregator", ["aggregator", "start"], workspace, grpc=port)
        record.status = ["running"]
        fp.wait_for_port(port, max(1.0, deadline - time.monotonic()), [agg])
        cols = [started(f"collaborator-{c}", ["collaborator", "start", "-n", c],
                        imports[c] / workspace.name) for c in collaborators]  # fmt: skip
        watch(agg, cols, deadline, report, workspace / "save" / FAILURE)
        report()  # the rounds validated since the last check
    except fp.FederationProcessError as err:
        return err
    finally:
        fp.stop(record.processes)
    return None


def watch(agg: fp.Process, cols: Sequence[fp.Process], deadline: float,
          on_tick: Callable[[], None], failure: Path) -> None:  # fmt: skip
    """Wait for the aggregator to end, calling `on_tick` between checks; raise
    FederationProcessError unless it ended well and every collaborator quit cleanly: naming a
    collaborator that died, the aggregator's failure (the error it wrote to `failure` when it
    stopped the federation, else its log), the timeout."""

    def ended() -> bool:
        on_tick()
        for col in cols:
            code = col.popen.poll()
            if code not in (None, 0):
                raise fp.FederationProcessError(
                    f"{col.name} (pid {col.pid}) died with exit code {code} while the aggregator "
                    "was running; OpenFL 1.9's aggregator waits for every collaborator of a round "
                    f"(WaitForAllPolicy), so the federation was stopped. Its log {col.log_path}:\n"
                    f"{col.log_tail(800)}"
                )
        return not agg.alive()

    fp.watch(ended, deadline, "the federation")
    if agg.popen.returncode != 0:
        if failure.exists():
            raise fp.FederationProcessError(
                f"the aggregator stopped the federation: {failure.read_text().strip()}"
            )
        raise fp.FederationProcessError(
            f"the aggregator exited with code {agg.popen.returncode}:\n{agg.log_tail()}"
        )
    fp.watch(lambda: not any(col.alive() for col in cols), deadline, "the collaborators")
    unclean = next((col for col in cols if col.popen.returncode != 0), None)
    if unclean is not None:  # told to quit, each leaves within a poll interval
        raise fp.FederationProcessError(
            f"{unclean.name} did not quit cleanly:\n{unclean.log_tail()}"
        )


def read_save(save: Path) -> tuple[list[dict[str, Any]], dict[int, dict[str, float]]]:
    """The privacy records of the released rounds, in order, and {r: validation scores of the
    global model after r rounds} (OpenFL's round r): the complete lines of the JSON-lines files
    the aggregator appends to in `save` (none if missing)."""
    lines = {}
    for name in (RECORDS, VALIDATION):
        text = (save / name).read_text() if (save / name).exists() else ""
        lines[name] = [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]
    return lines[RECORDS], {int(line.pop("round")): line for line in lines[VALIDATION]}


def rounds_frame(records: Sequence[Mapping[str, Any]],
                 scores: Mapping[int, Mapping[str, float]]) -> pd.DataFrame:  # fmt: skip
    """rounds.csv: per round r (0: the initial model) the round's trainers (`chosen`), its
    global model's validation scores and the privacy columns after r rounds, as
    `dpmed.fets.run` writes them (its simulated times and convergence score aside); a round
    released but not validated, or validated but not released, has the missing ones empty."""
    rows = []
    for r in sorted({*scores, *range(1, len(records) + 1)}):
        record = records[r - 1] if 1 <= r <= len(records) else {}
        rows.append({"round": r, "chosen": ";".join(record.get("chosen", [])),
                     **scores.get(r, {}),
                     **{c: record.get(c, math.nan) for c in privacy.ROUND_COLUMNS}})  # fmt: skip
    return pd.DataFrame(rows)


def not_covered(out: Path, run: Path, cfg: ServerConfig) -> list[str]:
    """privacy.json's `not_covered`: each file of the run folder `run` but model.pt
    (privacy.json, about to be written, among them) and each of the launch in `out`, and why."""
    written = [
        f"{name}: {why}"
        for name, why in NOT_COVERED.items()
        if name == "privacy.json" or (run / name).exists() or (out / name).exists()
    ]
    paper = list(privacy.PAPER_NOT_COVERED) if cfg.dpmode == "paper" else []
    return written + paper


def write_outputs(out: Path, run: Path, params: Mapping[str, Any], cfg: ServerConfig,
                  status: str) -> None:  # fmt: skip
    """rounds.csv, model.pt and privacy.json of the run in `run` (module docstring),
    privacy.json last: its `not_covered` names every file the launch in `out` wrote, its
    `extra.deployment` the engine, the launch's `status` and the rounds planned, released and
    not released."""
    from dpmed.fets.collaborator import load_numpy_state, model_arguments  # torch: imported here
    from dpmed.fets.run import MODEL
    from dpmed.models import build_model, save_model

    save = out / LAUNCH / "workspace" / "save"
    records, scores = read_save(save)
    run.mkdir(parents=True, exist_ok=True)
    if records or scores:
        write_csv(run / "rounds.csv", rounds_frame(records, scores))
    planned = list(range(1, int(params["rounds"]) + 1))
    released = [int(r["round"]) + 1 for r in records]
    deployment = {"engine": ENGINE, "status": status, "rounds_planned": len(planned),
                  "released_rounds": released,
                  "not_released_rounds": [r for r in planned if r not in released]}  # fmt: skip
    if records:
        arguments = model_arguments(params)
        net = build_model(MODEL, **arguments)
        with np.load(save / RELEASED) as state:
            load_numpy_state(net, {name: state[name] for name in state.files})
        save_model(run / "model.pt", MODEL, arguments, net)
        rejected = sum(int(r["rejected"]) for r in records)
        record = privacy.privacy_record(cfg, len(records), records[-1], rejected)
        record.extra["deployment"] = deployment
        covers = (f"{privacy.COVERS}: here model.pt and the released models in {LAUNCH}/"
                  "workspace/save (init.pbuf, last.pbuf, released_model.npz)")  # fmt: skip
        record = replace(record, covers=covers, not_covered=not_covered(out, run, cfg))
        record.write(run / "privacy.json", "fets")


def deploy(
    out: Path,
    processed: Path,
    params: Mapping[str, Any],
    wildcards: Mapping[str, str],
    partitions: Sequence[int],
    seeded: bool = False,
    timeout: float = 3600.0,
    template: Path = TEMPLATE,
    round_timeout: float = 600.0,
) -> dict[str, Any]:
    """Run one federation (module docstring) in a launch of `out`/openfl (`fp.launching`),
    its outputs in `out`/<run>; returns the final processes.json. Raises
    `FederationProcessError` after writing the outputs when it failed (before touching `out`
    when another launch holds it)."""
    out = Path(out).resolve()
    work, run = out / LAUNCH, out / SPEC.path.format(**wildcards)
    with fp.launching(work, [str(run)]) as record:
        for name in RUN_OUTPUTS:  # a run that fails early leaves no older output beside it
            (run / name).unlink(missing_ok=True)
        noise_seed = job_seed("fets", wildcards) if seeded else None
        cfg = server_config(params, wildcards, noise_seed)
        sites = {str(p): subset_folder(Path(processed), work / "sites" / str(p), [p])
                 for p in partitions}  # fmt: skip
        port = fp.free_port()
        plan = fill_plan(yaml.safe_load((template / "plan" / "plan.yaml").read_text()), params,
                         wildcards, cfg, port, round_timeout)  # fmt: skip
        if not plan["network"]["settings"]["use_tls"]:
            print(f"INSECURE: the OpenFL federation in {work} runs gRPC without TLS or client "
                  "authentication (network.settings.use_tls false); the aggregator listens on "
                  f"{plan['network']['settings'].get('bind_addr', '[::]')}:{port}",
                  file=sys.stderr, flush=True)  # fmt: skip
        workspace = work / "workspace"
        make_workspace(workspace, template, plan, sites)
        label = f"openfl {wildcards['aggregator']} {wildcards['dpmode']} eps0={wildcards['eps']}"
        error = run_federation(workspace, record, list(sites), port, timeout,
                               Progress(label, int(params["rounds"])))  # fmt: skip
        write_outputs(out, run, params, cfg, "failed" if error else "complete")
        if error:
            raise error
        record.status = ["complete"]
    return json.loads(record.path.read_text())


def checked_settings(
    config: Mapping[str, Any],
    sets: Sequence[tuple[str, Any]],
    wildcards: Mapping[str, str],
    files: Sequence[Path],
) -> dict[str, Any]:
    """The fets parameters of a launch: `config`'s fets.defaults with `sets` applied, checked
    with the launch's cell (`wildcards`: a private aggregator, its DP mode, eps0, seed)
    appended to its fets grid as the workflow checks a config; raises naming the key (and the
    option) of a bad value."""
    aggregator, dpmode, eps, seed = (wildcards[k] for k in ("aggregator", "dpmode", "eps", "seed"))
    if dpmode not in aggregators()[aggregator].modes:
        known = ", ".join(aggregators()[aggregator].modes)
        raise ConfigError("--dpmode", f"{aggregator} has no DP mode {dpmode!r} (known: {known})")
    config = copy.deepcopy(dict(config))
    config["fets"]["defaults"].update(dict(sets))
    try:
        eps0 = parse_eps(eps)
    except ValueError:
        raise ConfigError("--eps", f"got {eps!r}; eps0 is a positive number") from None
    if not seed.isdigit():
        raise ConfigError("--seed", f"got {seed!r}; the seed wildcard is an integer >= 0")
    cell = {"aggregators": [aggregator], "dpmodes": [dpmode], "eps": [eps0], "seeds": [int(seed)]}
    config["fets"]["grid"] = [*config["fets"]["grid"], cell]
    check_config(config, workflow_file("config/schema.yaml"), files)
    return config["fets"]["defaults"]


def _value(text: str) -> tuple[str, Any]:
    """KEY=VALUE with VALUE read as YAML, a number YAML 1.1 leaves a string (1e-5) as a float."""
    key, _, value = text.partition("=")
    if not value:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    parsed = yaml.safe_load(value)
    try:
        return key, float(parsed) if isinstance(parsed, str) else parsed
    except ValueError:
        return key, parsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = fp.launcher_parser("dpmed fl-openfl", __doc__, workflow_file("config/smoke.yaml"))
    parser.add_argument("--partitions", default="1,2,3", help="partition ids, one site each")
    parser.add_argument("--set", type=_value, action="append", default=[], metavar="KEY=VALUE",
                        help="override a fets parameter, e.g. rounds=2")  # fmt: skip
    private = [name for name in aggregators() if aggregators()[name].private]
    parser.add_argument("--aggregator", default="dp_simagg", choices=private)
    parser.add_argument("--dpmode", default="sound", choices=sorted(DP_MODES.names()))
    parser.add_argument("--eps", default="1", help="eps0 per round (wildcard spelling)")
    parser.add_argument("--seed", default="0", help="seed wildcard (common seeds)")
    args = parser.parse_args(argv)
    from snakemake_interface_common.exceptions import WorkflowError  # the schema check's error

    config = load_configs(args.config)
    wildcards = {"aggregator": args.aggregator, "dpmode": args.dpmode, "eps": args.eps,
                 "seed": args.seed}  # fmt: skip
    try:
        params = checked_settings(config, args.set, wildcards, args.config)
    except (ValueError, WorkflowError) as err:  # a ConfigError is a ValueError
        parser.exit(2, f"{parser.prog}: refused before starting anything: {err}\n")
    partitions = [int(p) for p in args.partitions.split(",")]
    out = args.out.resolve()

    def launch() -> dict[str, Any]:
        with fp.launch_lock(out / LAUNCH):  # the data stage too
            processed = args.processed or synthetic_processed("fets", config["data"]["fets"],
                                                              out / "data")  # fmt: skip
            return deploy(out, processed, params, wildcards, partitions, args.seeded,
                          args.timeout, round_timeout=args.round_timeout)  # fmt: skip

    return fp.finish(out / LAUNCH, launch)


if __name__ == "__main__":
    sys.exit(main())
