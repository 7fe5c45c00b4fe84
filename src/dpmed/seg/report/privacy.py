"""seg privacy tables: paper 002 Table 1 from the clip-rule registry, and each private
configuration's sound recipe beside the paper's recipe (`dpmed.seg.privacy.paper_recipe`)
recomputed for the same run."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.privacy.clipping import CLIP_RULES, ClipRule
from dpmed.report.privacy_summary import load_records
from dpmed.report.style import write_table
from dpmed.seg.morphology import parse_morph
from dpmed.seg.privacy import paper_recipe
from dpmed.seg.report.labels import model_label

MORPH_ORDER = ("none", "fixed", "adaptive", "adaptive per-image")
SEG_COLUMNS = (
    "clip", "morph", "datasets", "models", "n_runs", "clip_norm", "sigma", "noise_std", "q",
    "steps", "delta", "target_epsilon", "eps_rdp", "eps_prv", "guarantee", "reasons",
    "paper_noise_multiplier", "paper_steps", "paper_eps_rdp", "paper_guarantee", "paper_reasons",
)  # fmt: skip


def clip_rule_table(gamma: float | None = None, r: float | None = None) -> pd.DataFrame:
    """Paper 002 Table 1, one row per registered clip rule (registration order): our factor
    s(n) (C kept), hard clip, sensitivity of the summed update, constants (ClipRule defaults
    unless given), the paper's mechanism column, limitation and reference."""
    defaults = ClipRule("none")
    values = {
        "γ": defaults.gamma if gamma is None else gamma,
        "r": defaults.r if r is None else r,
    }
    rows = []
    for name, rule in CLIP_RULES.items():
        rows.append(
            {
                "rule": name,
                "label": rule.label,
                "scale_factor": f"s(n) = {rule.formula}",
                "hard_clip": "yes" if rule.hard_clip else "no",
                "sensitivity": "C" if rule.bounded else "unbounded",
                "constants": ", ".join(f"{s} = {values[s]:g}" for s in rule.constants),
                "paper_mechanism": rule.paper_mechanism,
                "limitation": rule.limitation,
                "reference": rule.reference,
            }
        )
    return pd.DataFrame(rows)


def write_clip_rule_table(csv_path: str | Path) -> None:
    """Table 1 with the registry's default constants, as csv (+ md)."""
    write_table(clip_rule_table(), csv_path)


def seg_privacy_table(privacy_paths: Iterable[str | Path]) -> pd.DataFrame:
    """Sound vs paper recipe per private seg configuration (non-private runs are skipped).

    Runs are pooled (n_runs, ε averaged) only when clip rule, morph kind, σ, C, q, steps, δ,
    guarantee and paper recipe all agree; datasets and models list the pooled runs'.
    """
    rows = []
    for path, rec in load_records(privacy_paths):
        if rec["guarantee"] == "none":
            continue
        wc = wildcards_from_path("seg", path)
        sigma, clip_norm = rec["noise_multipliers"][0], rec["clip_norm"]
        spec = parse_morph(wc["morph"])  # the sound per-image adaptive variant (-s) apart
        rows.append(
            {
                "clip": rec["extra"]["clip_rule"],
                "morph": f"{spec.kind} per-image" if spec.scope == "sample" else spec.kind,
                "dataset": wc["dataset"],
                "model": wc["model"],
                "clip_norm": clip_norm,
                "sigma": sigma,
                "noise_std": sigma * clip_norm,
                "q": rec["sample_rate"],
                "steps": rec["steps"],
                "delta": rec["delta"],
                "target_epsilon": rec["target_epsilon"],
                "eps_rdp": rec["epsilon_by_accountant"].get("rdp", math.nan),
                "eps_prv": rec["epsilon_by_accountant"].get("prv", math.nan),
                "guarantee": rec["guarantee"],
                "reasons": "; ".join(rec["reasons"]),
                **paper_recipe(rec, wc["model"], wc["morph"]),
            }
        )
    if not rows:
        raise ValueError("no private seg run among the given privacy.json files")
    runs = pd.DataFrame(rows)
    pooled = ["dataset", "model", "eps_rdp", "eps_prv"]
    keys = [c for c in runs.columns if c not in pooled]
    table = (
        runs.groupby(keys, dropna=False, sort=False)
        .agg(
            datasets=("dataset", _joined),
            models=("model", lambda models: _joined(model_label(m) for m in models)),
            n_runs=("model", "size"),
            eps_rdp=("eps_rdp", "mean"),
            eps_prv=("eps_prv", "mean"),
        )
        .reset_index()
    )
    table["clip_rank"] = table["clip"].map(CLIP_RULES.names().index)
    table["morph_rank"] = table["morph"].map(MORPH_ORDER.index)
    rest = [k for k in keys if k not in ("clip", "morph")]
    table = table.sort_values(["clip_rank", "morph_rank", "datasets", "models", *rest])
    return table[list(SEG_COLUMNS)].reset_index(drop=True)


def write_seg_privacy_table(privacy_paths: Iterable[str | Path], csv_path: str | Path) -> None:
    """`seg_privacy_table` as csv (+ md)."""
    write_table(seg_privacy_table(privacy_paths), csv_path)


def _joined(values: Iterable[str]) -> str:
    return ", ".join(sorted(set(values)))
