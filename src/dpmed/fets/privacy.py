"""Privacy accounting of a fets run, per round and cumulative.

Per round r (after r rounds), side by side:
- `eps_basic_cum` = r·ε0: basic sequential composition, the paper's Tε0;
- `eps_rdp_cum`: RDP composition of r Gaussian mechanisms with the run's σ/Δf, converted at
  δ = r·δ0 (the δ that basic composition reaches), Opacus' RDP accountant, sample rate 1.
A per-tensor DP mode (paper) releases one mechanism per tensor per round (K of them); the
paper counts one ("for the monitored weight tensor"). The `_all` columns compose all r·K
mechanisms (basic: r·K·ε0; RDP at the same δ). Paper-mode numbers take the empirical Δf as if
it were a sensitivity, so they are not a guarantee (`paper-approximation`).

The mechanism texts, reasons, utility notes and rule-specific fields of privacy.json come
from the run's aggregation rule and the DP mode wrapping it (`dpmed.fets.aggregation.
aggregator_mode`). The guarantee
covers what the server releases, the global model after every round (`COVERS`); the
collaborators' validation scores, the schedule, the timings and, in paper mode, the empirical
Δf are written beside it without noise (`not_covered`). `extra.noise_source` says whether the
noise was seeded (the simulation) or drawn from OS entropy. Updates the server's screen
rejected (`dpmed.fets.server.screen_round`) are counted per round (`rejected`) and over the run
(`extra.rejected_updates`); the guarantee holds with them as zero updates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpmed.fets.aggregation import CLASSIC_SIGMA_REASON, DP_MODES, ServerConfig
from dpmed.fets.server import RoundMechanisms
from dpmed.privacy.mechanisms import noise_source, rdp_epsilon
from dpmed.privacy.record import PrivacyRecord

ADJACENCY = "collaborator-level (replace one chosen collaborator's model tensors)"
COVERS = (
    "the global model after every round (each aggregate the server releases), hence model.pt "
    "and anything computed from the global models without the collaborators' data"
)
NOT_COVERED = (
    "rounds.csv, metrics.json: the Dice and HD95 scores of every round's global model (and "
    "the convergence score from them), computed on the collaborators' own validation "
    "subjects without noise",
    "selection.csv, rounds.csv chosen/round_time_s/sim_time_s: the seeded, data-independent "
    "selection schedule and simulated times from the collaborators' dataset sizes, treated "
    "as public",
    "resources.json: measured wall-clock time, memory and energy, a side channel the "
    "guarantee does not model",
    "rounds.csv rejected, privacy.json extra.rejected_updates and the server's warnings: which "
    "collaborators' updates the screen rejected (a non-finite entry or a norm beyond its limit), "
    "read from their uploads without noise",
)
# Paper mode releases its data-dependent sensitivity estimate as it is.
PAPER_NOT_COVERED = (
    "rounds.csv delta_f/sigma/sigma_min, privacy.json extra delta_f/sigma: paper mode's "
    "empirical Delta f, hence sigma, is computed from the clipped collaborator tensors and "
    "written without noise (docs/privacy.md, finding 1)",
)
COLUMNS = (
    "mechanisms", "delta_f", "sigma", "sigma_min", "noise_multiplier", "eps_round",
    "eps_basic_cum", "eps_rdp_cum", "eps_basic_cum_all", "eps_rdp_cum_all",
)  # fmt: skip
# rounds.csv's privacy columns: COLUMNS (the report's privacy table) and the rejected updates.
ROUND_COLUMNS = (*COLUMNS, "rejected")


def round_columns(cfg: ServerConfig, fl_round: int, mech: RoundMechanisms | None) -> dict:
    """The privacy columns of rounds.csv after round `fl_round` (empty for non-private runs)."""
    if mech is None:
        return {c: math.nan for c in ROUND_COLUMNS}
    eps0, delta_r = float(cfg.epsilon0), fl_round * cfg.delta0
    z, k = mech.noise_multiplier, mech.mechanisms
    return {
        "mechanisms": k,
        "delta_f": mech.delta_f,
        "sigma": mech.sigma,
        "sigma_min": mech.sigma_min,
        "noise_multiplier": z,
        "eps_round": eps0,
        "eps_basic_cum": fl_round * eps0,
        "eps_rdp_cum": rdp_epsilon(z, fl_round, delta_r),
        "eps_basic_cum_all": fl_round * k * eps0,
        "eps_rdp_cum_all": rdp_epsilon(z, fl_round * k, delta_r),
        "rejected": len(mech.rejected),
    }


def privacy_record(
    cfg: ServerConfig, rounds: int, last: Mapping[str, Any], rejected: int = 0
) -> PrivacyRecord:
    """privacy.json of the run.

    Args:
        cfg: the run's server configuration.
        rounds: the number of rounds T.
        last: the last round's row of rounds.csv (its privacy columns; unused when
            non-private).
        rejected: updates the server's screen rejected over the run (counted as zero
            updates).
    """
    mode, entry = DP_MODES[cfg.dpmode], cfg.mode
    if not mode.private:
        return PrivacyRecord.non_private(f"none ({cfg.aggregator}, no noise)", ADJACENCY, "none")
    delta_total = rounds * cfg.delta0
    extra = {
        "delta0_per_round": cfg.delta0,
        "eps0_per_round": cfg.epsilon0,
        "selection": "collaborators chosen by a seeded schedule independent of the data; "
        "no subsampling amplification is claimed (sample rate 1)",
        "mechanisms_per_round": int(last["mechanisms"]),
        "delta_f": last["delta_f"],
        "sigma": last["sigma"],
        "noise_source": noise_source(cfg.seed),
        "rejected_updates": rejected,
    }
    if mode.utility_notes:
        extra["utility_notes"] = list(mode.utility_notes)
    # Fields every DP mode shares.
    common = {
        "adjacency": ADJACENCY,
        "sampling": "none",
        "delta": delta_total,
        "clip_norm": cfg.clip_norm,
        "sample_rate": 1.0,
        "steps": rounds,
        "noise_multipliers": [last["noise_multiplier"]],
        "target_epsilon": cfg.epsilon0,
        "covers": COVERS,
        "extra": extra,
    }
    if mode.per_tensor:  # the paper's accounting: one monitored tensor, basic composition
        by = {
            "basic_per_tensor": last["eps_basic_cum"],
            "rdp_per_tensor": last["eps_rdp_cum"],
            "basic_all_tensors": last["eps_basic_cum_all"],
            "rdp_all_tensors": last["eps_rdp_cum_all"],
        }
        return PrivacyRecord(
            mechanism=entry.mechanism,
            accountant="basic composition (paper's T*eps0, one monitored tensor)",
            epsilon=last["eps_basic_cum"],
            guarantee=mode.guarantee,
            epsilon_by_accountant=by,
            reasons=[r for r in mode.reasons if r != CLASSIC_SIGMA_REASON or cfg.epsilon0 > 1],
            not_covered=[*NOT_COVERED, *PAPER_NOT_COVERED],
            **common,
        )
    by = {"basic": last["eps_basic_cum"], "rdp": last["eps_rdp_cum"]}
    extra["calibration"] = cfg.sound_calibration
    if entry.rule.privacy_extra is not None:
        extra.update(entry.rule.privacy_extra(last))
    return PrivacyRecord(
        mechanism=f"{entry.mechanism}; one Gaussian mechanism per round "
        f"({cfg.sound_calibration} calibration)",
        accountant="min(basic composition, RDP composition) at delta = rounds * delta0",
        epsilon=min(by.values()),
        guarantee=mode.guarantee,
        epsilon_by_accountant=by,
        not_covered=list(NOT_COVERED),
        **common,
    )
