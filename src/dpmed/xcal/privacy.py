"""privacy.json of an XCal-FL run: the final ε per client and the run's maximum.

Each client's guarantee is sample-level (add/remove one image of that client's data). Sampling is
Poisson (rate q = 1/S per step), which is what the RDP accountant assumes; the paper's code used
fixed-size batches (REFERENCE §4 item 5), so its ε was an approximation — this one is formal:
guarantee "dp". XCal-FL: signal share (ε_s, δ_s) by RDP of the non-adaptive signal mechanism,
gradient share (ε_g, δ_g) by the Rényi filter at α*, summed by sequential composition (App. B);
the joint RDP of both (min over orders, at δ) is given beside it.
"""

from __future__ import annotations

import numpy as np

from dpmed.privacy.adaptive import epsilon_of
from dpmed.privacy.record import PrivacyRecord
from dpmed.xcal.client import Client, MethodSpec

POISSON_REASON = (
    "Poisson sampling at rate q = 1/ceil(n/B) per step replaces the paper's fixed-size batches, "
    "so the RDP accountant's sampling assumption holds (REFERENCE §4 item 5)"
)
ADJACENCY = "sample-level (add/remove one image of one client's data)"


def privacy_record(
    clients: list[Client], spec: MethodSpec, eps: float, params: dict
) -> PrivacyRecord:
    """The PrivacyRecord of a finished run (guarantee "none" for non-private methods)."""
    steps = [c.stats.steps for c in clients]
    rates = [c.q for c in clients]
    if spec.kind == "plain":
        return PrivacyRecord.non_private(
            "none (non-private SGD)",
            ADJACENCY,
            "poisson",
            sample_rate=max(rates),
            steps=max(steps),
            extra={"client_steps": steps, "client_sample_rates": rates},
        )
    per_client = [float(c.epsilon()) for c in clients]
    extra: dict[str, object] = {
        "client_epsilon": per_client,
        "client_steps": steps,
        "client_sample_rates": rates,
        "client_sigma_ref": [c.sigma_ref for c in clients],
    }
    if spec.kind == "xcal":
        joint = [epsilon_of(c.ledger.rdp + c.signal_ledger.rdp, params["delta"]) for c in clients]
        extra.update(
            {
                "signal_fraction": params["signal_fraction"],
                "client_epsilon_signal": [c.signal_ledger.epsilon(c.delta_signal) for c in clients],
                "client_epsilon_gradient": [c.ledger.epsilon(c.delta_grad) for c in clients],
                "client_sigma_signal": [c.sigma_signal for c in clients],
                "filter_order": [c.filter.order for c in clients],
                "filter_budget_rdp": [c.filter.budget for c in clients],
                "filter_spent_rdp": [c.filter.spent() for c in clients],
                "filter_raised_steps": [c.filter.raised for c in clients],
                "client_halted": [c.filter.halted for c in clients],
                "sigma_band": [1 - params["band"], 1 + params["band"]],
            }
        )
        mechanism = (
            "XCal-FL: Poisson-subsampled Gaussian on the clipped signal sum (sensitivity 1) + "
            "DP-SGD (flat clipping) with adaptive sigma_t under a Renyi filter"
        )
        by_accountant = {"rdp_sequential": max(per_client), "rdp_joint": max(joint)}
        sigmas = sorted({round(s, 6) for c in clients for s in c.stats.sigmas})
        noise = [float(min(sigmas)), float(max(sigmas))] if sigmas else []
    else:
        if spec.kind == "agp":
            extra["agp_sigma"] = (
                "top_q channels sigma_ref, others (1+b) sigma_ref; accounted at sigma_ref"
            )
        mechanism = "DP-SGD, Poisson-subsampled Gaussian, flat clipping (per client)"
        by_accountant = {"rdp": max(per_client)}
        noise = sorted({float(c.sigma_ref) for c in clients})
    return PrivacyRecord(
        mechanism=mechanism,
        adjacency=ADJACENCY,
        sampling="poisson",
        accountant="rdp",
        epsilon=float(np.max(per_client)),
        delta=params["delta"],
        guarantee="dp",
        clip_norm=params["clip_norm"],
        sample_rate=max(rates),
        steps=max(steps),
        noise_multipliers=noise,
        target_epsilon=eps,
        epsilon_by_accountant=by_accountant,
        reasons=[POISSON_REASON],
        extra=extra,
    )
