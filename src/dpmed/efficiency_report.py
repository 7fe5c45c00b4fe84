"""Measured jobs of a real SLURM run as points of the job cost model (`dpmed.job_cost`), read
from the SLURM executor's efficiency report or from `sacct` output; `bench/job_cost.py refit`
refits the coefficients on them.

snakemake-executor-plugin-slurm (`--slurm-efficiency-report`) writes, when the workflow ends,
`efficiency_report_<run uuid>.csv` into `--slurm-efficiency-report-path` (default: the folder
Snakemake was started from): one row per job step of the run (the batch and extern steps
dropped), read with `sacct --name=<run uuid>`, with the job's comment as `RuleName`, the step's
wall seconds `Elapsed_sec` and its peak RSS `MaxRSS_MB`. The executor sets every job's comment
to `rule_<rule>_wildcards_<values>` (the job's wildcard values in the order of its output path,
joined by `_`, `/` replaced by `_`), `rule_<rule>` for a job without wildcards, and a group
job's to the group's name. The same numbers come from
`sacct --parsable2 -o JobID,Comment,Elapsed,MaxRSS` with its header line (more columns may
follow, in any order). Both need the site to store job comments
(`AccountingStoreFlags=job_comment` in slurm.conf).

A job's measure is the sum of its steps' elapsed seconds (the rule's run with the start-up of
Snakemake inside the job) and the largest of their peaks. Only jobs of the fitted rules
(`dpmed.sizing.sized_rules`) become points, and a comment whose values match no cell of the
given grid (another config) cannot be sized.

A group job (the workflow profile bundles seg cells, `seg_cell`, and xcal runs, `xcal_run`) has
the comment `rule_<group>_<its rules>`, without wildcards; its members are named by its SLURM
log, which the executor keeps with `--slurm-keep-successful-logs` as
`<slurm logdir>/group_<group>_<rules>/<SLURM job id>.log` (`group_logs`): Snakemake inside the
job prints each member's rule and wildcards when it starts it (`rule seg_train:`, then
`    wildcards: dataset=duke, ...`) and `Finished jobid: N` when it ends. A group job's
measures are its members' together, so they are used only as far as they are sound:

- time: members that ran one after another (what the log shows: no member starts before the
  one before it finished; on a GPU the workflow profile's one-GPU pool serialises them)
  take the sum of their times, and the time model is linear in its coefficients, so the group
  is one equation Σ over members of their time features · coefficients = its elapsed seconds
  (`groups`: a point whose features are its members'; `bench/job_cost.py` fits the rules a
  group links jointly). Members that overlapped (a CPU run packs cells side by side) give no
  time equation.
- memory: the job's peak bounds every member's peak from above (members in sequence: the
  largest of theirs; side by side: their sum), so it becomes one memory point only, of the
  member the current model predicts the largest peak for. The envelope fit then keeps that
  member's prediction at or above the job's peak: conservative (it may overstate that member),
  and the group's request, which Snakemake takes as the largest of its members' (their runtimes
  summed), covers the measured peak again.
A group job of one member is that member's point. A group job without its log (logs not kept
or not given) is left out, as is one with a member of another config or an unfitted rule.
"""

from __future__ import annotations

import csv
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from dpmed import job_cost
from dpmed.sizing import sized_rules
from dpmed.studies import STUDIES

if TYPE_CHECKING:
    from dpmed.config.grid import Grid

RSS_UNITS_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}
SACCT_COLUMNS = ("JobID", "Comment", "Elapsed", "MaxRSS")
# Lines of Snakemake's log: a job's start (`rule X:`, indented inside a group's summary), its
# fields, its end.
JOB_HEADER = re.compile(r"^(\s*)(?:local)?(?:rule|checkpoint) (\S+):$")
JOB_FIELD = re.compile(r"^\s+(wildcards|jobid): (.*)$")
JOB_FINISHED = re.compile(r"^Finished jobid: (\S+) ")


@dataclass(frozen=True)
class MeasuredJob:
    """One SLURM job: its id, comment, wall seconds (summed over its steps) and peak RSS in MB
    (the largest of its steps')."""

    job_id: str
    comment: str
    seconds: float
    peak_mb: float


def elapsed_seconds(text: str) -> float:
    """Seconds of a sacct duration: `[D-]HH:MM:SS`, `MM:SS[.fff]` or `SS[.fff]`."""
    days, _, clock = text.strip().rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = 60 * seconds + float(part)
    return seconds + 86400 * int(days or 0)


def rss_mb(text: str) -> float:
    """MB of a sacct memory figure (`320616K`, `1.5G`; `0` or empty when nothing was
    sampled)."""
    text = text.strip()
    if text in ("", "0"):
        return 0.0
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT])", text)
    if not match:
        raise ValueError(f"not a sacct memory figure (number and K/M/G/T): {text!r}")
    return float(match[1]) * RSS_UNITS_MB[match[2]]


def _jobs(comments: Mapping[str, str], steps: list[tuple[str, float, float]]) -> list[MeasuredJob]:
    """One `MeasuredJob` per job with at least one step, from job id → comment and (job id,
    seconds, peak MB) per step."""
    seconds: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for job_id, sec, peak in steps:
        seconds[job_id] = seconds.get(job_id, 0.0) + sec
        peaks[job_id] = max(peaks.get(job_id, 0.0), peak)
    return [MeasuredJob(job_id, comments.get(job_id, ""), seconds[job_id], peaks[job_id])
            for job_id in seconds]  # fmt: skip


def read_plugin_report(path: Path) -> list[MeasuredJob]:
    """The jobs of an efficiency report of snakemake-executor-plugin-slurm (CSV)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and "RuleName" not in rows[0]:
        raise ValueError(f"{path}: no RuleName column: the cluster stored no job comments "
                         "(AccountingStoreFlags=job_comment)")  # fmt: skip
    comments = {row["MainJobID"]: row["RuleName"] for row in rows}
    steps = [(row["MainJobID"], float(row["Elapsed_sec"]), float(row["MaxRSS_MB"]))
             for row in rows]  # fmt: skip
    return _jobs(comments, steps)


def read_sacct(path: Path) -> list[MeasuredJob]:
    """The jobs of `sacct --parsable2` output with a header naming at least `SACCT_COLUMNS`;
    a job's row gives its comment, its numbered steps' rows the measures."""
    lines = Path(path).read_text().splitlines()
    header = lines[0].split("|")
    missing = [c for c in SACCT_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{path}: sacct output without the columns {missing} (header {header})")
    comments: dict[str, str] = {}
    steps = []
    for line in filter(None, lines[1:]):
        row = dict(zip(header, line.split("|"), strict=True))
        job_id, _, step = row["JobID"].partition(".")
        if not step:
            comments[job_id] = row["Comment"]
        elif step not in ("batch", "extern"):
            steps.append((job_id, elapsed_seconds(row["Elapsed"]), rss_mb(row["MaxRSS"])))
    return _jobs(comments, steps)


def read_jobs(path: Path) -> list[MeasuredJob]:
    """The jobs of an efficiency report or of sacct output (told apart by the header)."""
    with open(path) as f:
        first = f.readline()
    return read_sacct(path) if "|" in first else read_plugin_report(path)


def parse_comment(comment: str) -> tuple[str, str]:
    """(rule or group name, wildcard values as the executor joined them) of a job comment."""
    name, _, values = comment.removeprefix("rule_").partition("_wildcards_")
    return name, values


def wildcard_values(study: str, wildcards: Mapping[str, str]) -> str:
    """A job's wildcard values as the executor writes them into its comment: in the order of
    the study's output path, joined by `_`, `/` replaced by `_`."""
    order = dict.fromkeys(f for _, f, _, _ in string.Formatter().parse(STUDIES[study].path) if f)
    return "_".join(str(wildcards[name]) for name in order).replace("/", "_")


@dataclass(frozen=True)
class GroupLog:
    """What a group job's SLURM log names: its members (rule, wildcards) in the order they
    started, and whether they ran one after another (no start before the previous member's
    end)."""

    members: tuple[tuple[str, dict[str, str]], ...]
    serial: bool


def read_group_log(path: Path) -> GroupLog:
    """The members of a group job from its SLURM log. The in-job Snakemake that runs the members
    prints each one's start unindented (the group's summary before it lists them indented) and
    its end as `Finished jobid: N`; a log with no unindented start names its members without
    saying how they ran (`serial` False)."""
    events: list[dict[str, Any]] = []  # job starts (rule, indent, fields) and ends (jobid)
    for line in Path(path).read_text(errors="replace").splitlines():
        if header := JOB_HEADER.match(line):
            events.append({"rule": header[2], "indent": header[1], "jobid": None, "wc": {}})
        elif (field := JOB_FIELD.match(line)) and events and "rule" in events[-1]:
            if field[1] == "jobid":
                events[-1]["jobid"] = field[2].strip()
            else:
                events[-1]["wc"] = dict(item.split("=", 1) for item in field[2].split(", "))
        elif end := JOB_FINISHED.match(line):
            events.append({"end": end[1]})
    starts = [e for e in events if "rule" in e]
    run = [e for e in starts if not e["indent"]]
    members = {(e["rule"], tuple(e["wc"].items())): e["wc"] for e in run or starts}
    serial, running = bool(run), set()
    for event in events:
        if "end" in event:
            running.discard(event["end"])
        elif not event["indent"]:
            serial = serial and not running
            running.add(event["jobid"])
    return GroupLog(tuple((rule, wc) for (rule, _), wc in members.items()), serial)


def group_logs(folders: list[Path]) -> dict[str, GroupLog]:
    """SLURM job id → `GroupLog` of every group job log under `folders` (the executor's
    `--slurm-logdir`, default .snakemake/slurm_logs: `group_<name>/<job id>.log`)."""
    return {path.stem: read_group_log(path)
            for folder in folders for path in sorted(Path(folder).glob("group_*/**/*.log"))
            if path.stem.isdigit()}  # fmt: skip


class CostPoints(NamedTuple):
    """What `cost_points` found: rule → points, group time points, why each other job was
    left out."""

    points: dict[str, list[dict[str, Any]]]
    groups: list[dict[str, Any]]
    skipped: list[str]


def _why_not(
    name: str, log: GroupLog | None, named: list[tuple[str, str]], matches: list[list[dict]]
) -> str:
    """Why a job whose comment names `name` (its group log `log`, its members (rule, wildcard
    values) `named` and their matching grid cells `matches`) is no point, or '' when it is."""
    if log is None and name not in sized_rules():
        grouped = [r for r in sized_rules() if name.endswith(f"_{r}") or f"_{r}_" in name]
        return ("a group job whose members are not named (its SLURM log not kept or not given: "
                "--slurm-keep-successful-logs, refit --slurm-logs DIR)" if grouped
                else "not a fitted rule")  # fmt: skip
    if not named:
        return "its SLURM log names no job"
    others = sorted({rule for rule, _ in named} - set(sized_rules()))
    if others:
        return f"a group job with members of rules that are not fitted ({', '.join(others)})"
    bad = [len(m) for m in matches if len(m) != 1]
    return f"{bad[0]} cells of the grid match the wildcards of a job" if bad else ""


def cost_points(
    jobs: list[MeasuredJob],
    config: Mapping[str, Any],
    grid: Grid,
    logs: Mapping[str, GroupLog] | None = None,
    model: Mapping[str, Any] | None = None,
) -> CostPoints:
    """The points of the measured `jobs` (module docstring) and why each other job was left out.

    A point has `source` slurm, `cell` (rule and wildcard values), the job's wildcards, params
    and the data sections its wildcards name (the study's and its dataset's, so a refit can
    recompute its features), its cost features and `measured` (`mem`: peak RSS MB, `time`:
    wall seconds; a group job's memory point has no `time`). A group time point has `source`,
    `cell` (its members' cells joined by `+`), `job` (SLURM id and comment), `members` (each
    with `rule` beside a point's fields, no `measured`) and `measured`. The jobs are matched to
    cells of `grid` (the run's config) by their comments, a group job's members by its log in
    `logs` (SLURM job id → `GroupLog`); the group's largest member is the one `model` (default:
    the saved coefficients) predicts the largest peak for. A cell measured twice keeps its later
    job."""
    model = model or job_cost.coefficients()
    cells: dict[tuple[str, str], list[dict[str, str]]] = {}
    for rule, study in sized_rules().items():
        for job in grid.jobs(study):
            cells.setdefault((rule, wildcard_values(study, job.wc)), []).append(job.wc)
    points: dict[str, dict[str, dict[str, Any]]] = {}
    groups: dict[str, dict[str, Any]] = {}
    skipped = []
    for job in jobs:
        name, values = parse_comment(job.comment)
        log = (logs or {}).get(job.job_id) if name not in sized_rules() else None
        named = [(name, values)] if log is None else [
            (rule, wildcard_values(sized_rules()[rule], wc) if rule in sized_rules() and wc
             else "")
            for rule, wc in log.members]  # fmt: skip
        matches = [cells.get(member, []) for member in named]
        why = _why_not(name, log, named, matches)
        unfitted = sorted({rule for rule, _ in named} - set(model["rules"]))
        if not why and not job.peak_mb:
            why = f"no peak sampled ({job.peak_mb} MB)"
        elif not why and len(named) > 1 and unfitted:
            why = f"a group job with members of rules not fitted yet ({', '.join(unfitted)})"
        if why:
            skipped.append(f"job {job.job_id} ({job.comment}): {why}")
            continue
        members = [_member(rule, wc[0], config, grid) for (rule, _), wc in
                   zip(named, matches, strict=True)]  # fmt: skip
        measured = {"mem": job.peak_mb, "time": job.seconds}
        if len(members) == 1:
            largest = members[0]
        else:
            largest = max(members, key=lambda m: _predicted_mb(m, model))
            measured.pop("time")
            if log.serial:
                group = {"source": "slurm", "cell": "+".join(m["cell"] for m in members),
                         "job": f"{job.job_id} {job.comment}", "members": members,
                         "measured": {"time": job.seconds, "mem": job.peak_mb}}  # fmt: skip
                groups[group["cell"]] = group
            else:
                skipped.append(f"job {job.job_id} ({job.comment}): its time (its members "
                               "overlapped; its peak is kept as a memory point)")  # fmt: skip
        point = {k: v for k, v in largest.items() if k != "rule"}
        rule = largest["rule"]
        points.setdefault(rule, {})[point["cell"]] = dict(point, measured=measured)
    found = {rule: list(rows.values()) for rule, rows in points.items()}
    return CostPoints(found, list(groups.values()), skipped)


def _member(rule: str, wc: dict[str, str], config: Mapping[str, Any], grid: Grid) -> dict:
    """A job of `rule` at the grid cell `wc`, as a point without measures (and with its rule)."""
    study = sized_rules()[rule]
    params = grid.params(study, wc)
    data = {name: section for name, section in config["data"].items()
            if name == study or name in wc.values()}  # fmt: skip
    mem, time = job_cost.features(rule, {"data": data}, wc, params)
    return {"source": "slurm", "cell": f"{rule}/{wildcard_values(study, wc)}", "rule": rule,
            "wildcards": wc, "params": params, "data": data, "mem": mem, "time": time}  # fmt: skip


def _predicted_mb(member: Mapping[str, Any], model: Mapping[str, Any]) -> float:
    """The peak MB `model` predicts for a group member."""
    cost = job_cost.predict(member["rule"], member["mem"], member["time"], model)
    return cost.host_mb + cost.compute_mb
