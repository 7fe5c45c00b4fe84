"""privacy.json of a seg run (DESIGN principle 2): DP-SGD facts with ε from both RDP and PRV
for the same (σ, q, steps), or guarantee "none" for non-private runs; adaptive DP-Morph with
batch-level thresholds is labelled "paper-approximation" (it couples the images of a batch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpmed.privacy import accounting
from dpmed.privacy.clipping import ClipRule
from dpmed.privacy.record import PrivacyRecord
from dpmed.seg.morphology import MorphSpec


def seg_privacy_record(
    private: bool,
    params: Mapping[str, Any],
    rule: ClipRule,
    spec: MorphSpec,
    q: float,
    sigma: float | None,
    target_eps: float,
    empty_batches: int,
    mode: str,
    history: list[tuple[float, float, int]],
    n_train: int,
) -> PrivacyRecord:
    adjacency = "sample-level (add/remove one image)"
    if not private:
        return PrivacyRecord.non_private(
            "none: non-private training (no clipping, no noise)",
            adjacency,
            "fixed-size",
            extra={"batch_size": int(params["batch_size"])},
        )
    delta = float(params["delta"])
    by_acc = {name: accounting.epsilon(history, delta, name) for name in accounting.ACCOUNTANTS}
    reasons = []
    if spec.kind == "adaptive" and spec.scope == "batch":
        reasons.append(
            "adaptive DP-Morph with batch-level thresholds (paper 002 §3.2): each image's "
            "morphology depends on the other images of the batch, so one image can change "
            "every per-sample gradient and the sensitivity C of the sum does not hold; "
            "the morph variant adaptive-vN-s uses the per-image (sound) policy"
        )
    return PrivacyRecord(
        mechanism=f"DP-SGD, Poisson-subsampled Gaussian, {rule.name} clipping "
        "(per-sample scale factors, every scaled gradient norm ≤ C, noise std σ·C)",
        adjacency=adjacency,
        sampling="poisson",
        accountant=params["accountant"],
        epsilon=by_acc[params["accountant"]],
        delta=delta,
        guarantee="paper-approximation" if reasons else "dp",
        clip_norm=rule.clip_norm,
        sample_rate=q,
        steps=int(sum(n for _, _, n in history)),
        noise_multipliers=[float(sigma)],
        target_epsilon=target_eps,
        epsilon_by_accountant=by_acc,
        reasons=reasons,
        extra={
            "clip_rule": rule.name,
            "autos_gamma": rule.gamma,
            "r": rule.r,
            "grad_sample_mode": mode,
            "expected_batch_size": q * n_train,
            "empty_batches": empty_batches,
        },
    )
