"""Empirical privacy audit: a measured ε lower bound from one training run with canaries
(Steinke, Nasr & Jagielski 2023). `bound` turns guesses into ε; `dirac` holds DP-SGD's
white-box gradient canaries; `seg`, `xcal` and `fets` audit a real cell of their study (imported
on their own: they load the study runners), `cell` holds what they share and `runs` dispatches
to them (`audit_cell`, `SETTINGS`) and is the command line."""

from dpmed.privacy.audit.bound import (
    AuditResult,
    audit_from_scores,
    best_audit,
    binomial_tail,
    eps_lower_bound,
    guess_grid,
    p_value,
)

__all__ = [
    "AuditResult",
    "audit_from_scores",
    "best_audit",
    "binomial_tail",
    "eps_lower_bound",
    "guess_grid",
    "p_value",
]
