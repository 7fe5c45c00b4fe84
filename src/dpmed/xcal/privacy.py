"""privacy.json of an XCal-FL run: the proven ε bound per client and the run's maximum.

Each client's guarantee is sample-level (add/remove one image of that client's data) and covers
every model update it sends, hence the global model of every round. Sampling is Poisson (rate
q = 1/S per step), which is what the RDP accountant assumes; the paper's code used fixed-size
batches, so its ε was an approximation, while this one is formal: guarantee "dp". A client
spends only in the rounds the server samples it in (`extra.client_rounds`); the public schedule
gives no amplification. `epsilon` is a bound that holds whatever the data made the run do: for
fixed-σ methods the RDP of the steps taken, for XCal-FL (and its random-σ_t control) the smaller
of its filter guarantee and the worst case of its σ band (`dpmed.xcal.methods.XCalFL.epsilon`),
calibrated so that the filter guarantee reaches the target ε (`dpmed.xcal.calibration`). A
method whose paper recipe has no finite ε (`Method.paper_flaw`: AGP as paper 001 describes it)
is "paper-approximation".
`eps_realised_reading` (in `extra`) is the RDP of the σ actually used: for XCal-FL it is smaller
and not a guarantee.
"""

from __future__ import annotations

import numpy as np

from dpmed.privacy.mechanisms import NOISE_SEEDED
from dpmed.privacy.record import PrivacyRecord
from dpmed.xcal.account import ClientAccount
from dpmed.xcal.methods import Method

POISSON_REASON = (
    "Poisson sampling at rate q = 1/ceil(n/B) per step replaces the paper's fixed-size batches, "
    "so the RDP accountant's sampling assumption holds (docs/privacy.md, finding 5)"
)
ADJACENCY = "sample-level (add/remove one image of one client's data)"
COVERS = (
    "every model update a client sends to the server, hence the global model of every round "
    "(model.pt) and everything computed from it alone"
)
NOT_COVERED = [
    "rounds.csv, road.json, gradcam.npz: scores, ROAD curves and Grad-CAM maps of the test "
    "split (its images are not protected; as far as the clients' data go they are "
    "post-processing of the covered global model)",
    "metrics.json client_sizes and privacy.json client_sample_rates: the clients' dataset "
    "sizes, treated as public as DP-SGD accounting does",
    "metrics.json seconds, step_seconds and forward_pair_seconds: wall-clock timings, a side "
    "channel the guarantee does not model",
]
REALISED_NOTE = (
    "eps_realised_reading sums the realised RDP of the noise actually used; where sigma_t was "
    "chosen from the data (XCal-FL) it is a reading, not a guarantee: epsilon is the bound"
)


def privacy_record(
    clients: list[ClientAccount], method: Method, eps: float, params: dict
) -> PrivacyRecord:
    """The PrivacyRecord of a finished run (guarantee "none" for non-private methods).

    Args:
        clients: the run's client accounts after training.
        method: the method they trained with.
        eps: the target ε.
        params: the job's hyperparameters.
    """
    steps = [c.stats.steps for c in clients]
    rates = [c.q for c in clients]
    sampling = {
        "client_rounds": [c.rounds for c in clients],
        "clients_per_round": min(params["clients_per_round"], len(clients)),
    }
    if not method.dp:
        return PrivacyRecord.non_private(
            method.mechanism,
            ADJACENCY,
            "poisson",
            sample_rate=max(rates),
            steps=max(steps),
            extra={"client_steps": steps, "client_sample_rates": rates, **sampling},
        )
    per_client = [float(c.epsilon()) for c in clients]
    realised = [float(c.realised_epsilon()) for c in clients]
    by_accountant, noise, method_extra = method.privacy_details(clients, params)
    extra: dict[str, object] = {
        "client_epsilon": per_client,
        "eps_realised_reading": max(realised),
        "client_eps_realised_reading": realised,
        "eps_realised_reading_note": REALISED_NOTE,
        "client_steps": steps,
        "client_sample_rates": rates,
        **sampling,
        "client_sigma_ref": [method.reference_sigma(c) for c in clients],
        "noise_source": NOISE_SEEDED,
        **method_extra,
    }
    return PrivacyRecord(
        mechanism=method.mechanism,
        adjacency=ADJACENCY,
        sampling="poisson",
        accountant="rdp",
        epsilon=float(np.max(per_client)),
        delta=params["delta"],
        guarantee="dp" if method.paper_flaw is None else "paper-approximation",
        clip_norm=params["clip_norm"],
        sample_rate=max(rates),
        steps=max(steps),
        noise_multipliers=noise,
        target_epsilon=eps,
        epsilon_by_accountant=by_accountant,
        reasons=[POISSON_REASON, *([method.paper_flaw] if method.paper_flaw else [])],
        covers=COVERS,
        not_covered=NOT_COVERED,
        extra=extra,
    )
