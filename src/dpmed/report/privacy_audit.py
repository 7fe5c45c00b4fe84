"""The empirical privacy audit's table and figure: every audit.json of the
`privacy_audit` rule, claimed ε beside the measured lower bound.

The lower bound is that of the one-run audit (Steinke, Nasr & Jagielski 2023,
`dpmed.privacy.audit.bound`): with probability at least `confidence` no mechanism satisfying
the claimed (ε, δ) could have produced as many correct guesses, so `eps_lower > eps_claimed`
(`violation`) refutes the claim at that confidence. The converse does not hold: a bound below
the claim is no proof of privacy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dpmed.report.style import save_figure, write_table  # noqa: E402
from dpmed.studies import STUDIES  # noqa: E402

AUDIT_COLUMNS = (
    "study", "run", "mechanism", "setting", "guarantee", "eps_claimed", "eps_lower", "violation",
    "noise_scale", "confidence", "canaries", "guesses", "correct", "delta", "canary_norm",
)  # fmt: skip
MARKERS = {"gradient": "o", "input": "s", "update": "D"}  # by setting; any other: "^"
VIOLATION_COLOR = "tab:red"


def audit_table(audit_paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per audit.json, sorted by study, run, setting and decreasing noise scale;
    `run` is the audited run folder below results/ (`privacy_summary.csv`'s `run`) and
    `violation` is eps_lower > eps_claimed."""
    rows = []
    for path in audit_paths:
        record = json.loads(Path(path).read_text())
        row = {column: record.get(column) for column in AUDIT_COLUMNS}
        run = STUDIES[record["study"]].path.format(**record["wildcards"])
        row["run"] = run.removeprefix("results/")
        row["violation"] = bool(record["eps_lower"] > record["eps_claimed"])
        rows.append(row)
    if not rows:
        raise ValueError("no audit.json given")
    frame = pd.DataFrame(rows, columns=list(AUDIT_COLUMNS))
    frame = frame.sort_values(
        ["study", "run", "setting", "noise_scale"], ascending=[True, True, True, False]
    )
    return frame.reset_index(drop=True)


def run_audits(audit_paths: Sequence[str | Path], guarantees: Mapping[str, str]) -> pd.DataFrame:
    """Per audited run (`run` → its privacy record's guarantee in `guarantees`), over its audits
    of the run as configured: the largest lower bound (`audit_eps_lower`) and whether any
    exceeds the claimed ε (`audit_violation`). An audit counts when it ran at noise scale 1 and
    claims the run's own guarantee; one that claims another (seg `paper-noise`, which retrains
    the cell with its clip rule's public-code noise, a `paper-approximation`) audits another
    recipe and stays in privacy_audit.csv only. No rows when no audit counts."""
    table = audit_table(audit_paths) if audit_paths else pd.DataFrame(columns=AUDIT_COLUMNS)
    own = table["guarantee"] == table["run"].map(guarantees)
    grouped = table[own & (table["noise_scale"] == 1)].groupby("run", sort=True)
    return pd.DataFrame(
        {
            "audit_eps_lower": grouped["eps_lower"].max(),
            "audit_violation": grouped["violation"].any(),
        }
    )


def audit_figure(table: pd.DataFrame, png_path: str | Path) -> None:
    """Claimed ε (x) against the measured lower bound (y) of every audit: one marker shape per
    setting, hollow for a power control (noise scale ≠ 1), red where the bound exceeds the
    claim; the diagonal y = x. Each point is labelled with study, mechanism, noise scale and
    correct/guesses (the labels of points at one claimed ε stacked upwards in the order of
    their bounds). Both axes share one scale, symmetric-log when the claims span more than a
    factor 10 (0 stays on the axis), so the diagonal stays straight."""
    fig, ax = plt.subplots(figsize=(7.5, 6), layout="constrained")
    claimed = table["eps_claimed"].to_numpy(float)
    lower = table["eps_lower"].to_numpy(float)
    top = 1.3 * max(float(np.nanmax(lower)), float(claimed.max()))
    if claimed.max() > 10 * claimed.min():
        threshold = 10 ** np.floor(np.log10(claimed.min()))
        for axis_scale in (ax.set_xscale, ax.set_yscale):
            axis_scale("symlog", linthresh=threshold)
    diagonal = np.concatenate([[0.0], np.geomspace(claimed.min() / 100, top, 200)])
    ax.plot(diagonal, diagonal, color="gray", linestyle="--", linewidth=1,
            label="lower bound = claimed ε")  # fmt: skip
    for setting, rows in table.groupby("setting", sort=True):
        marker = MARKERS.get(str(setting), "^")
        for configured in (True, False):
            sel = rows[(rows["noise_scale"] == 1) == configured]
            if sel.empty:
                continue
            colors = [VIOLATION_COLOR if v else "tab:blue" for v in sel["violation"]]
            ax.scatter(
                sel["eps_claimed"],
                sel["eps_lower"],
                marker=marker,
                s=40,
                label=f"{setting}" + ("" if configured else " (noise scale ≠ 1)"),
                facecolors=colors if configured else "none",
                edgecolors=colors,
            )
    ax.scatter([], [], color=VIOLATION_COLOR, label="lower bound > claimed ε (violation)")
    ordered = table.sort_values("eps_lower", kind="stable")
    stacked = ordered.assign(rank=ordered.groupby(ordered["eps_claimed"].round(3)).cumcount())
    for row in stacked.itertuples(index=False):
        ax.annotate(
            f"{row.study} {row.mechanism} {row.setting} ×{row.noise_scale:g} "
            f"({row.correct}/{row.guesses})",
            (row.eps_claimed, row.eps_lower),
            fontsize=6,
            xytext=(5, 4 + 9 * row.rank),
            textcoords="offset points",
            color=VIOLATION_COLOR if row.violation else "black",
        )
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("claimed ε (accountant)")
    ax.set_ylabel("empirical ε lower bound")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(
        f"One-run privacy audit: {_describe(table['confidence'])} confidence, "
        f"m = {_describe(table['canaries'])} canaries; labels: correct/guesses (k)",
        fontsize=9,
    )
    save_figure(fig, png_path)


def _describe(values: Sequence | pd.Series) -> str:
    """The distinct values, e.g. `0.95` or `200/1000`."""
    return "/".join(f"{v:g}" for v in sorted(set(values)))


def write_privacy_audit(audits: Sequence[str], csv_path: str | Path, png_path: str | Path) -> None:
    """results/tables/privacy_audit.csv (+ .md, .html) and results/figures/privacy_audit.png
    (+ .pdf) from the audit.json files."""
    table = audit_table(audits)
    write_table(table, csv_path)
    audit_figure(table, png_path)
