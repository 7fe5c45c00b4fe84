"""privacy.json of an XCal-FL run: the final ε per client and the run's maximum.

Each client's guarantee is sample-level (add/remove one image of that client's data). Sampling
is Poisson (rate q = 1/S per step), which is what the RDP accountant assumes; the paper's code
used fixed-size batches, so its ε was an approximation, while this one is formal: guarantee
"dp". The method adds its own fields (`Method.privacy_details`); XCal-FL's signal share is
accounted by RDP of the non-adaptive signal mechanism and its gradient share by the Rényi
filter at α*, summed by sequential composition (paper App. B), with the joint RDP of both
beside it.
"""

from __future__ import annotations

import numpy as np

from dpmed.privacy.record import PrivacyRecord
from dpmed.xcal.client import Client
from dpmed.xcal.methods import Method

POISSON_REASON = (
    "Poisson sampling at rate q = 1/ceil(n/B) per step replaces the paper's fixed-size batches, "
    "so the RDP accountant's sampling assumption holds (docs/privacy.md, finding 5)"
)
ADJACENCY = "sample-level (add/remove one image of one client's data)"


def privacy_record(
    clients: list[Client], method: Method, eps: float, params: dict
) -> PrivacyRecord:
    """The PrivacyRecord of a finished run (guarantee "none" for non-private methods).

    Args:
        clients: the run's clients after training.
        method: the method they trained with.
        eps: the target ε.
        params: the job's hyperparameters.
    """
    steps = [c.stats.steps for c in clients]
    rates = [c.q for c in clients]
    if not method.dp:
        return PrivacyRecord.non_private(
            method.mechanism,
            ADJACENCY,
            "poisson",
            sample_rate=max(rates),
            steps=max(steps),
            extra={"client_steps": steps, "client_sample_rates": rates},
        )
    per_client = [float(c.epsilon()) for c in clients]
    by_accountant, noise, method_extra = method.privacy_details(clients, params)
    extra: dict[str, object] = {
        "client_epsilon": per_client,
        "client_steps": steps,
        "client_sample_rates": rates,
        "client_sigma_ref": [c.sigma_ref for c in clients],
        **method_extra,
    }
    return PrivacyRecord(
        mechanism=method.mechanism,
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
