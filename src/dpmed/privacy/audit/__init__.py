"""Empirical privacy audit: a measured ε lower bound from one training run with canaries
(Steinke, Nasr & Jagielski 2023). `bound` turns guesses into ε; `dirac` holds DP-SGD's
white-box gradient canaries; `cell` holds what every audited cell shares; `runs` dispatches to
the audit runner a study's spec names (`StudySpec.audit`: `<study>.audit:audit_cell`, imported
only by an audit job) and is the command line."""

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
