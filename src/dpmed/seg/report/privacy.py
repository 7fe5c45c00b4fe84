"""seg privacy tables: paper 002 Table 1 from the clip-rule registry, and each private
configuration's sound recipe beside the paper's recipe recomputed for the same run."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from dpmed.config.grid import wildcards_from_path
from dpmed.privacy import accounting
from dpmed.privacy.clipping import RULE_INFO, RULES, ClipRule
from dpmed.report.privacy_summary import load_records
from dpmed.seg.report.main import MODEL_LABEL, morph_kind

# Inf-Net (paper 002 code, REFERENCE.md §4 item 6) took several DP steps per sampled batch: its
# public training loop (Inf-Net's MyTrain_LungInf.py) rescales each batch to size_rates
# (0.75, 1, 1.25) and calls optimizer.step() once per scale, k = 3. Counting k·steps treats the
# k steps as separately sampled (what Opacus' accountant reports when hooked to every
# optimizer.step); they reuse one batch, so the exact cost is higher still (σ/√k per batch).
INFNET_STEPS_PER_BATCH = 3
MORPH_ORDER = ("none", "fixed", "adaptive", "adaptive per-image")
SEG_COLUMNS = (
    "clip", "morph", "datasets", "models", "n_runs", "clip_norm", "sigma", "noise_std", "q",
    "steps", "delta", "target_epsilon", "eps_rdp", "eps_prv", "guarantee", "reasons",
    "paper_noise_multiplier", "paper_steps", "paper_eps_rdp", "paper_guarantee", "paper_reasons",
)  # fmt: skip
NOT_DP = "not DP"
PAPER_REASONS = {
    "loader": "the paper's code trains on a shuffled fixed-size loader while the accountant "
    "assumes Poisson subsampling (REFERENCE.md §4 item 6)",
    "dice": "its Dice loss is summed over the batch, coupling the images: one image changes "
    "every per-sample gradient, so the per-sample sensitivity C does not hold (§4 item 6)",
    "adaptive": "adaptive DP-Morph thresholds over the batch couple the images (paper 002 §3.2)",
    "nsgd": "the public NSGD implementation scales the noise by r instead of the sensitivity C: "
    "noise multiplier σ·r/C (§4 item 7)",
    "psac": "not DP: data-dependent noise scale (the public PSAC implementation scales the noise "
    "by the maximum per-sample threshold of the batch, §4 item 7)",
    "infnet": f"Inf-Net took {INFNET_STEPS_PER_BATCH} DP steps per batch but counted one: ε "
    f"recomputed with {INFNET_STEPS_PER_BATCH}× the steps, a lower bound (§4 item 6)",
}


def clip_rule_table(gamma: float | None = None, r: float | None = None) -> pd.DataFrame:
    """Paper 002 Table 1, one row per rule of `RULES`: our factor s(n) (C kept), hard clip,
    sensitivity of the summed update, constants (ClipRule defaults unless given), the paper's
    mechanism column, limitation and reference."""
    defaults = ClipRule("none")
    values = {
        "γ": defaults.gamma if gamma is None else gamma,
        "r": defaults.r if r is None else r,
    }
    rows = []
    for name in RULES:
        info = RULE_INFO[name]
        rows.append(
            {
                "rule": name,
                "label": info.label,
                "scale_factor": f"s(n) = {info.factor}",
                "hard_clip": "yes" if info.hard_clip else "no",
                "sensitivity": "C" if ClipRule(name).bounded else "unbounded",
                "constants": ", ".join(f"{s} = {values[s]:g}" for s in info.constants),
                "paper_mechanism": info.paper_mechanism,
                "limitation": info.limitation,
                "reference": info.reference,
            }
        )
    return pd.DataFrame(rows)


def _morph_label(morph: str) -> str:
    """Morph kind, with the sound per-image adaptive variant (`-s`) named apart."""
    kind = morph_kind(morph)
    return f"{kind} per-image" if kind == "adaptive" and morph.endswith("-s") else kind


def paper_recipe(record: dict, model: str, morph: str) -> dict[str, object]:
    """The paper's recipe (REFERENCE.md §4 items 6–7) recomputed for one private seg run:
    noise multiplier, accounted steps, ε by RDP at the run's δ, guarantee and reasons."""
    rule = record["extra"]["clip_rule"]
    sigma, steps = record["noise_multipliers"][0], int(record["steps"])
    reasons = [PAPER_REASONS["loader"], PAPER_REASONS["dice"]]
    if morph_kind(morph) == "adaptive":
        reasons.append(PAPER_REASONS["adaptive"])
    if model == "infnet":
        steps *= INFNET_STEPS_PER_BATCH
        reasons.append(PAPER_REASONS["infnet"])
    if rule == "psac":
        reasons.insert(0, PAPER_REASONS["psac"])
        multiplier, eps = math.nan, math.inf
    else:
        multiplier = sigma
        if rule == "nsgd":
            multiplier = sigma * record["extra"]["r"] / record["clip_norm"]
            reasons.insert(0, PAPER_REASONS["nsgd"])
        history = [(multiplier, record["sample_rate"], steps)]
        eps = accounting.epsilon(history, record["delta"], "rdp")
    return {
        "paper_noise_multiplier": multiplier,
        "paper_steps": steps,
        "paper_eps_rdp": eps,
        "paper_guarantee": NOT_DP if rule == "psac" else "paper-approximation",
        "paper_reasons": "; ".join(reasons),
    }


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
        rows.append(
            {
                "clip": rec["extra"]["clip_rule"],
                "morph": _morph_label(wc["morph"]),
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
            models=("model", lambda models: _joined(MODEL_LABEL[m] for m in models)),
            n_runs=("model", "size"),
            eps_rdp=("eps_rdp", "mean"),
            eps_prv=("eps_prv", "mean"),
        )
        .reset_index()
    )
    table["clip_rank"] = table["clip"].map(RULES.index)
    table["morph_rank"] = table["morph"].map(MORPH_ORDER.index)
    rest = [k for k in keys if k not in ("clip", "morph")]
    table = table.sort_values(["clip_rank", "morph_rank", "datasets", "models", *rest])
    return table[list(SEG_COLUMNS)].reset_index(drop=True)


def _joined(values: Iterable[str]) -> str:
    return ", ".join(sorted(set(values)))
