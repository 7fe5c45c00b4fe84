"""Which per-sample-gradient engine a private seg job uses (`grad_sample_mode`): the
configured one, or the model's when `auto`. Kept apart from `dpmed.privacy.dpsgd`, which
imports Opacus (about 2 s), because every seg job resolves its mode, private or not."""

from __future__ import annotations

GRAD_SAMPLE_MODES = ("hooks", "functorch", "ghost", "bk")
# `auto` per model: a fixed table, not a timing taken at run time, so that one config gives one
# result on a machine whatever its load. `bench/dp_step.py --quick` times the engines per seg
# model: bk (one-backward book-keeping) is the fastest for every one, and its clipped sum
# equals the per-sample loop (tests/test_bookkeeping.py).
AUTO_GRAD_SAMPLE_MODE: dict[str, str] = {
    "unet": "bk",
    "unetpp": "bk",
    "lfunet": "bk",
    "infnet": "bk",
}


def resolve_grad_sample_mode(mode: str, model_name: str) -> str:
    """The concrete per-sample-gradient mode: `mode`, or the model's choice when `auto`."""
    if mode == "auto":
        return AUTO_GRAD_SAMPLE_MODE.get(model_name, "hooks")
    if mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode '{mode}' not in auto, {', '.join(GRAD_SAMPLE_MODES)}")
    return mode
