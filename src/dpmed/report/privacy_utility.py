"""Privacy–utility figures shared by the studies: utility against the privacy budget ε.

A study gives one row per run (`panel`, `line`, `eps`, `value`; one run per seed): `points`
averages each (panel, line, ε) over seeds with its interval
(`dpmed.report.intervals.shown_interval`: none from fewer than 3 seeds, on the logit scale
for a bounded metric), and `figure` draws one panel per `panel` value, each
`line` as mean ± interval against finite ε (log axis, the figure's whole ε range in every
panel), and each non-private line (ε = ∞) as a dashed horizontal reference with its interval as
a band. A point without an interval states its seed count ("n = 2 seeds"). A panel without
any private run says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dpmed.report.intervals import INTERVAL_METHOD, UNIT, shown_interval  # noqa: E402
from dpmed.report.style import (  # noqa: E402
    NOT_LEARNED,
    UNLEARNED,
    chance_line,
    grey_unlearned_points,
    note_seeds,
    plain_log_ticks,
    series_look,
)

DODGE = 1.06  # ratio between neighbouring lines' x at one ε (log axis)
POINT_COLUMNS = ["panel", "line", "eps", "n_seeds", "mean", "ci_low", "ci_high"]


def points(
    runs: pd.DataFrame, bounds: tuple[float, float] | None = UNIT, confidence: float = 0.95
) -> pd.DataFrame:
    """Mean and `confidence` interval over seeds (`shown_interval` within `bounds`) per
    (panel, line, eps), in the order the groups first appear in `runs` (columns
    `POINT_COLUMNS`; NaN runs left out)."""
    rows = []
    for (panel, line, eps), group in runs.groupby(["panel", "line", "eps"], sort=False):
        values = group["value"].astype(float).to_numpy()
        values = values[np.isfinite(values)]
        if not values.size:
            continue
        mean, low, high = shown_interval(values, bounds, confidence)
        rows.append([panel, line, float(eps), len(values), mean, low, high])
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


def named(data: pd.DataFrame, metric: str) -> pd.DataFrame:
    """`points` output with the statistics named after the metric, the tables' convention
    (`<metric>_mean`, `<metric>_ci_low`, `<metric>_ci_high`)."""
    return data.rename(columns={s: f"{metric}_{s}" for s in ("mean", "ci_low", "ci_high")})


def figure(
    data: pd.DataFrame,
    ylabel: str,
    title: str,
    floors: Mapping[str, float] | None = None,
    rule: str = "",
    chances: Mapping[str, float] | None = None,
) -> plt.Figure:
    """One panel per `panel` of `points` output: DP lines vs ε (plain log ticks),
    non-private references. A point below its panel's learning floor (`floors[panel]`, the
    claims layer's: `rule` says it) is greyed, "did not learn"; `chances[panel]`: the
    chance line of a classification panel."""
    every = list(dict.fromkeys(data["panel"]))
    # a panel with no private run has nothing to say about privacy vs utility: named in the
    # title instead of drawn (unless no panel has one)
    private = set(data.loc[np.isfinite(data["eps"]), "panel"])
    panels = [p for p in every if p in private] or every
    dropped = [p for p in every if p not in panels]
    # up to 3 columns, as few unused slots as possible (4 panels: 2 × 2, not 3 + 1 + 2 blank)
    cols = min((c for c in (3, 2, 1) if c <= max(len(panels), 1)), key=lambda c: -len(panels) % c)
    rows = max(math.ceil(len(panels) / cols), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.remove()
    colors = plt.get_cmap("tab10")
    eps = data.loc[np.isfinite(data["eps"]), "eps"]
    for ax, panel in zip(axes.flat, panels, strict=False):
        sub = data[data["panel"] == panel]
        dodged = list(dict.fromkeys(sub.loc[np.isfinite(sub["eps"]), "line"]))
        for i, (line, pts) in enumerate(sub.groupby("line", sort=False)):
            color = colors(i % 10)
            private = pts[np.isfinite(pts["eps"])].sort_values("eps")
            if not private.empty:
                err = np.vstack(
                    [private["mean"] - private["ci_low"], private["ci_high"] - private["mean"]]
                )
                # lines side by side around each ε (a few % on the log axis), so methods at
                # the same value keep their markers and intervals apart
                x = private["eps"] * DODGE ** (dodged.index(line) - (len(dodged) - 1) / 2)
                ax.errorbar(
                    x, private["mean"], yerr=err, color=color, capsize=3, label=line,
                    **series_look(i),
                )  # fmt: skip
                note_seeds(ax, x, private["mean"], private["n_seeds"])
                if floors is not None:
                    grey_unlearned_points(
                        ax,
                        x,
                        private["mean"],
                        floors[panel],
                        rule,
                        series_look(i)["marker"],
                        color,
                    )
            for ref in pts[~np.isfinite(pts["eps"])].itertuples(index=False):
                dashes = (0, (6, 2 + i % 4))  # dashed, a period of its own per line
                # a reference that did not learn is drawn grey and says so in its label
                low = floors is not None and ref.mean < floors[panel]
                ax.axhline(ref.mean, color=UNLEARNED["edgecolor"] if low else color,
                           linestyle=dashes,
                           label=f"{line} (ε = ∞{f', {NOT_LEARNED}' if low else ''})")  # fmt: skip
                if np.isfinite(ref.ci_low):
                    ax.axhspan(ref.ci_low, ref.ci_high, color=color, alpha=0.12, linewidth=0)
        if not np.isfinite(sub["eps"]).any():
            note = "no private run of this panel in the grid:\nnon-private reference only"
            ax.text(
                0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", fontsize=8,
                color="grey",
            )  # fmt: skip
        if chances is not None:
            chance_line(ax, chances[panel])
        if not eps.empty:
            ax.set_xscale("log")
            ax.set_xlim(eps.min() / 2, eps.max() * 2)
            plain_log_ticks(ax.xaxis)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("ε")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6)
    note = f"\nnot drawn, no private run in the grid: {', '.join(dropped)}" if dropped else ""
    fig.suptitle(f"{title}\n(mean; {INTERVAL_METHOD}){note}", fontsize=9)
    fig.tight_layout()
    return fig
