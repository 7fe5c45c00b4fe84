"""Global-loss membership inference (paper 002 §5.4, Fig. 9): attack metrics.

The attacker scores each image by s = −loss (higher = more likely a training member) and
predicts "member" iff s ≥ τ. With members' scores M (n₁ of them) and non-members' scores N (n₀):

- AUC = P(S_M > S_N) + ½ P(S_M = S_N) over all n₁·n₀ pairs (Mann–Whitney U / n₁n₀, ties ½),
  the area under the ROC curve of the rule s ≥ τ;
- ROC: for τ = +∞ and every distinct score, TPR(τ) = #{M ≥ τ}/n₁, FPR(τ) = #{N ≥ τ}/n₀;
- balanced accuracy at τ = (TPR(τ) + 1 − FPR(τ))/2;
- advantage = max over the ROC of TPR − FPR (≥ 0: τ = +∞ gives 0);
- TPR at FPR ≤ α = the largest TPR of a ROC point whose FPR ≤ α, exactly (no interpolation).
  FPR takes the values k/n₀, so with n₀ < 1/α only FPR = 0 qualifies: the value is then the
  share of members scoring strictly above every non-member.

τ is chosen on a calibration split (`choose_threshold`) and applied to a disjoint evaluation
split, so the reported balanced accuracy is not fitted to the images it is measured on.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np


def _scores(values: np.ndarray | list[float], name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError(f"no {name} scores")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} scores contain NaN or inf")
    return arr


def auc(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """Mann–Whitney AUC of member vs non-member scores, ties counted ½."""
    m, n = _scores(members, "member"), np.sort(_scores(nonmembers, "non-member"))
    below = np.searchsorted(n, m, side="left")  # non-members strictly below each member
    equal = np.searchsorted(n, m, side="right") - below
    return float((below.sum() + 0.5 * equal.sum()) / (m.size * n.size))


def roc(members: np.ndarray, nonmembers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thresholds, TPR, FPR) of the rule s ≥ τ for τ = +∞ then every distinct score,
    descending; TPR and FPR are non-decreasing from (0, 0) to (1, 1)."""
    m = np.sort(_scores(members, "member"))
    n = np.sort(_scores(nonmembers, "non-member"))
    thresholds = np.concatenate([[np.inf], np.unique(np.concatenate([m, n]))[::-1]])
    tpr = (m.size - np.searchsorted(m, thresholds, side="left")) / m.size
    fpr = (n.size - np.searchsorted(n, thresholds, side="left")) / n.size
    return thresholds, tpr, fpr


def balanced_accuracy(members: np.ndarray, nonmembers: np.ndarray, threshold: float) -> float:
    """(TPR + TNR)/2 of the rule s ≥ threshold."""
    tpr = float(np.mean(_scores(members, "member") >= threshold))
    tnr = float(np.mean(_scores(nonmembers, "non-member") < threshold))
    return (tpr + tnr) / 2


def choose_threshold(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """τ maximising balanced accuracy on these (calibration) scores.

    Candidates are the distinct scores (rule s ≥ τ); the lowest one predicts everyone a member,
    so the optimum is ≥ ½. Ties between candidates go to the largest τ (fewest predicted
    members). The chosen score is then moved down to the midpoint with the next lower distinct
    score, the max-margin τ that splits the calibration scores the same way (unchanged when it
    is the lowest score)."""
    m, n = _scores(members, "member"), _scores(nonmembers, "non-member")
    thresholds, tpr, fpr = roc(m, n)
    candidates, ba = thresholds[1:], (tpr[1:] + 1 - fpr[1:]) / 2  # drop τ = +∞
    best = int(np.flatnonzero(ba == ba.max())[0])  # descending τ: first = largest
    if best + 1 < candidates.size:
        return float((candidates[best] + candidates[best + 1]) / 2)
    return float(candidates[best])


def advantage(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """max over the ROC of TPR − FPR (the attack's membership advantage, ≥ 0)."""
    _, tpr, fpr = roc(members, nonmembers)
    return float(np.max(tpr - fpr))


def tpr_at_fpr(members: np.ndarray, nonmembers: np.ndarray, target: float) -> float:
    """Largest TPR of a ROC point with FPR ≤ target (exact: FPR = k/n₀ compared as fractions,
    so e.g. FPR = 1/100 meets target 0.01)."""
    if not 0 <= target <= 1:
        raise ValueError(f"target FPR must be in [0, 1], got {target}")
    _, tpr, fpr = roc(members, nonmembers)
    n0 = _scores(nonmembers, "non-member").size
    limit = Fraction(str(target)) * n0  # allowed false positives
    allowed = np.rint(fpr * n0) <= float(limit)
    return float(tpr[allowed].max())


def tpr_at_fpr_1pct(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """TPR at FPR ≤ 1 %."""
    return tpr_at_fpr(members, nonmembers, 0.01)


def tpr_at_fpr_01pct(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """TPR at FPR ≤ 0.1 %."""
    return tpr_at_fpr(members, nonmembers, 0.001)


# The threshold-free metrics, each a function of the evaluation (members, non-members) scores
# alone, so a report can bootstrap them over the evaluation images.
THRESHOLD_FREE = {
    "auc": auc,
    "tpr_at_fpr_1pct": tpr_at_fpr_1pct,
    "tpr_at_fpr_0.1pct": tpr_at_fpr_01pct,
}


def attack_metrics(
    calibration: tuple[np.ndarray, np.ndarray], evaluation: tuple[np.ndarray, np.ndarray]
) -> dict[str, float]:
    """Every metric of the module: τ from the calibration (members, non-members) scores, all
    others on the evaluation scores."""
    threshold = choose_threshold(*calibration)
    m, n = evaluation
    return {
        "auc": auc(m, n),
        "threshold": threshold,
        "balanced_accuracy": balanced_accuracy(m, n, threshold),
        "advantage": advantage(m, n),
        "tpr_at_fpr_1pct": tpr_at_fpr_1pct(m, n),
        "tpr_at_fpr_0.1pct": tpr_at_fpr_01pct(m, n),
    }
