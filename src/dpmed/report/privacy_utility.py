"""Privacy–utility figures shared by the studies: utility against the privacy budget ε.

A study gives one row per run (`panel`, `line`, `eps`, `value`; one run per seed): `points`
averages each (panel, line, ε) over seeds with the 95 % Student-t interval
(`dpmed.report.intervals.t_interval`), and `figure` draws one panel per `panel` value, each
`line` as mean ± interval against finite ε (log axis, the figure's whole ε range in every
panel), and each non-private line (ε = ∞) as a dashed horizontal reference with its interval as
a band. With one seed a point has no interval. A panel without any private run says so.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dpmed.report.intervals import t_interval  # noqa: E402

POINT_COLUMNS = ["panel", "line", "eps", "n_seeds", "mean", "ci_low", "ci_high"]


def points(runs: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Mean and `confidence` t-interval over seeds per (panel, line, eps), in the order the
    groups first appear in `runs` (columns `POINT_COLUMNS`; NaN runs left out)."""
    rows = []
    for (panel, line, eps), group in runs.groupby(["panel", "line", "eps"], sort=False):
        values = group["value"].astype(float).to_numpy()
        values = values[np.isfinite(values)]
        if not values.size:
            continue
        mean, low, high = t_interval(values, confidence)
        rows.append([panel, line, float(eps), len(values), mean, low, high])
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


def named(data: pd.DataFrame, metric: str) -> pd.DataFrame:
    """`points` output with the statistics named after the metric, the tables' convention
    (`<metric>_mean`, `<metric>_ci_low`, `<metric>_ci_high`)."""
    return data.rename(columns={s: f"{metric}_{s}" for s in ("mean", "ci_low", "ci_high")})


def figure(data: pd.DataFrame, ylabel: str, title: str) -> plt.Figure:
    """One panel per `panel` of `points` output: DP lines vs ε, non-private references."""
    panels = list(dict.fromkeys(data["panel"]))
    cols = min(len(panels), 3) or 1
    rows = max(math.ceil(len(panels) / cols), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    colors = plt.get_cmap("tab10")
    eps = data.loc[np.isfinite(data["eps"]), "eps"]
    for ax, panel in zip(axes.flat, panels, strict=False):
        sub = data[data["panel"] == panel]
        for i, (line, pts) in enumerate(sub.groupby("line", sort=False)):
            color = colors(i % 10)
            private = pts[np.isfinite(pts["eps"])].sort_values("eps")
            if not private.empty:
                err = np.vstack(
                    [private["mean"] - private["ci_low"], private["ci_high"] - private["mean"]]
                )
                ax.errorbar(
                    private["eps"], private["mean"], yerr=np.nan_to_num(err), color=color,
                    marker="o", capsize=3, label=line,
                )  # fmt: skip
            for ref in pts[~np.isfinite(pts["eps"])].itertuples(index=False):
                ax.axhline(ref.mean, color=color, linestyle="--", label=f"{line} (ε = ∞)")
                if np.isfinite(ref.ci_low):
                    ax.axhspan(ref.ci_low, ref.ci_high, color=color, alpha=0.12, linewidth=0)
        if not np.isfinite(sub["eps"]).any():
            note = "no private run of this panel in the grid:\nnon-private reference only"
            ax.text(
                0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", fontsize=8,
                color="grey",
            )  # fmt: skip
        if not eps.empty:
            ax.set_xscale("log")
            ax.set_xlim(eps.min() / 2, eps.max() * 2)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("ε")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6)
    fig.suptitle(f"{title} (mean and 95 % t-interval over seeds)", fontsize=10)
    fig.tight_layout()
    return fig
