"""The cross-study privacy summary: every DP run of the registered studies with its mechanism,
adjacency, sampling, accountant, ε, δ, guarantee, reasons, what the guarantee covers and the
dataset's privacy unit, read from the runs' privacy.json; for a run the empirical privacy audit
measured as configured (`dpmed.report.privacy_audit.run_audits`), its largest ε lower bound and
whether it exceeds the claimed ε (`audit_violation`; empty for a run not audited)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.report.privacy_audit import run_audits
from dpmed.report.style import write_table
from dpmed.studies import STUDIES

SUMMARY_COLUMNS = (
    "study", "run", "mechanism", "adjacency", "sampling", "accountant", "epsilon", "delta",
    "target_epsilon", "noise_multipliers", "sample_rate", "steps", "guarantee", "reasons", "covers",
    "privacy_unit", "audit_eps_lower", "audit_violation",
)  # fmt: skip


def load_records(paths: Iterable[str | Path]) -> list[tuple[Path, dict]]:
    """(path, privacy.json content) per file, in the given order."""
    return [(Path(p), json.loads(Path(p).read_text())) for p in paths]


def privacy_summary(
    privacy_paths: Iterable[str | Path], audit_paths: Sequence[str | Path] = ()
) -> pd.DataFrame:
    """Every DP run (guarantee ≠ none) of any study, sorted by study and run folder; one
    eps_<accountant> column per accountant any run reports (NaN where a run lacks it). The
    audit.json files `audit_paths` (those of the run as configured count, `run_audits`) fill
    `audit_eps_lower` and `audit_violation` (True / False; both empty for a run without one)."""
    rows = []
    for path, rec in load_records(privacy_paths):
        if rec["guarantee"] == "none":
            continue
        study, run = _run_of(path)
        row = {key: rec[key] for key in SUMMARY_COLUMNS[2:-2]} | {
            "study": study,
            "run": run,
            "noise_multipliers": "; ".join(f"{s:.6g}" for s in rec["noise_multipliers"]),
            "reasons": "; ".join(rec["reasons"]),
        }
        row.update({f"eps_{k}": v for k, v in rec["epsilon_by_accountant"].items()})
        rows.append(row)
    if not rows:
        raise ValueError("no DP run among the given privacy.json files")
    frame = pd.DataFrame(rows)
    audits = run_audits(audit_paths, dict(zip(frame["run"], frame["guarantee"], strict=True)))
    frame["audit_eps_lower"] = frame["run"].map(audits["audit_eps_lower"]).astype(float)
    violation = frame["run"].map(audits["audit_violation"]).astype(object)
    frame["audit_violation"] = violation.where(violation.notna(), "")
    accountants = sorted(c for c in frame.columns if c not in SUMMARY_COLUMNS)
    columns = [*SUMMARY_COLUMNS, *accountants]
    return frame[columns].sort_values(["study", "run"]).reset_index(drop=True)


def write_privacy_summary(
    privacy: Sequence[str | Path], audits: Sequence[str | Path], csv_path: str | Path
) -> None:
    """results/tables/privacy_summary.csv (+ .md, .html): the `privacy_summary` of the runs'
    privacy.json files and the audit.json files."""
    write_table(privacy_summary(privacy, audits), csv_path)


def _run_of(path: Path) -> tuple[str, str]:
    """(study, run folder relative to results/) of a file inside a run folder."""
    for study, spec in STUDIES.items():
        try:
            wc = wildcards_from_path(study, path)
        except ValueError:
            continue
        return study, spec.path.format(**wc).removeprefix("results/")
    raise ValueError(f"{path} is not inside a run folder of any study")
