"""Empirical privacy audit: a measured ε lower bound from one training run with canaries
(Steinke, Nasr & Jagielski 2023). `bound` turns guesses into ε; `dirac` holds DP-SGD's
white-box gradient canaries; `runs` audits a real seg or xcal cell (imported on its own: it
loads the study runners)."""

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
