"""Privacy accounting of a fets run, per round and cumulative.

Per round r (after r rounds), side by side:
- `eps_basic_cum` = r·ε0: basic sequential composition, the paper's Tε0;
- `eps_rdp_cum`: RDP composition of r Gaussian mechanisms with the run's σ/Δf, converted at
  δ = r·δ0 (the δ that basic composition reaches), Opacus' RDP accountant, sample rate 1.
A per-tensor DP mode (paper) releases one mechanism per tensor per round (K of them); the
paper counts one ("for the monitored weight tensor"). The `_all` columns compose all r·K
mechanisms (basic: r·K·ε0; RDP at the same δ). Paper-mode numbers take the empirical Δf as if
it were a sensitivity, so they are not a guarantee (`paper-approximation`).

The mechanism texts, reasons and aggregator-specific fields of privacy.json come from the
aggregator's registry entry (`dpmed.fets.aggregation.AGGREGATORS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpmed.fets.aggregation import DP_MODES
from dpmed.fets.server import RoundMechanisms, ServerConfig
from dpmed.privacy.mechanisms import rdp_epsilon
from dpmed.privacy.record import PrivacyRecord

ADJACENCY = "collaborator-level (replace one chosen collaborator's model tensors)"
COLUMNS = (
    "mechanisms", "delta_f", "sigma", "sigma_min", "noise_multiplier", "eps_round",
    "eps_basic_cum", "eps_rdp_cum", "eps_basic_cum_all", "eps_rdp_cum_all",
)  # fmt: skip


def round_columns(cfg: ServerConfig, fl_round: int, mech: RoundMechanisms | None) -> dict:
    """The privacy columns of rounds.csv after round `fl_round` (empty for non-private runs)."""
    if mech is None:
        return {c: math.nan for c in COLUMNS}
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
    }


def privacy_record(cfg: ServerConfig, rounds: int, last: Mapping[str, Any]) -> PrivacyRecord:
    """privacy.json of the run.

    Args:
        cfg: the run's server configuration.
        rounds: the number of rounds T.
        last: the last round's row of rounds.csv (its privacy columns; unused when
            non-private).
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
    }
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
            reasons=list(entry.reasons),
            **common,
        )
    by = {"basic": last["eps_basic_cum"], "rdp": last["eps_rdp_cum"]}
    extra["calibration"] = cfg.sound_calibration
    if entry.privacy_extra is not None:
        extra.update(entry.privacy_extra(last))
    return PrivacyRecord(
        mechanism=f"{entry.mechanism}; one Gaussian mechanism per round "
        f"({cfg.sound_calibration} calibration)",
        accountant="min(basic composition, RDP composition) at delta = rounds * delta0",
        epsilon=min(by.values()),
        guarantee=mode.guarantee,
        epsilon_by_accountant=by,
        **common,
    )
