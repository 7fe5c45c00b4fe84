"""Noise calibration over the paper grid: time and ε reached under RDP and PRV, and the ε of
Opacus' default orders (1.1 … 63) at the same σ.

One row per distinct (ε, δ, q, steps) the paper config (config/config.yaml) asks for:

- xcal: B = 64, 30 rounds × 1 local epoch; a client with n images samples at q = 1/ceil(n/B)
  for T = 30·ceil(n/B) steps. n = the MedMNIST train size (BloodMNIST 11,959, PneumoniaMNIST
  4,708, DermaMNIST 7,007) split evenly over the config's 10 clients (ε 0.05, 0.5, 5, 50),
  3 and 50 clients (ε 0.5), or 1 (centralized, ε 0.5). The static and AGP methods calibrate
  (ε, 1e-5); XCal-FL calibrates its signal share 0.1·(ε, δ) and gradient share 0.9·(ε, δ).
- seg: ε = 200, δ = 1e-5, q = B/N, T = epochs·int(N/B) (B 8, 50 epochs; COVID-CT B 24, 100
  epochs) for N = 66 (Duke: 6 train subjects × 11 annotated B-scans), 425 (UMN: 17 × 25),
  60 (COVID-CT: 60 % of 100 slices), and N = 1000, 3000 for larger training sets.
- fets: the server-side Gaussian of DP-SimAgg / sound DP-FedAvg, q = 1, one step per round,
  ε ∈ {1, 10} at δ = 1e-5 (`mechanisms.rdp_sigma`).

Columns: σ, calibration time (first call: caches cleared) and the ε that σ reaches, under
"rdp" and "prv"; the time of one PRV ε at the RDP σ (what a seg run's report pays per
accountant call); Opacus' old calibration (`get_noise_multiplier`, default orders 1.1 … 63,
tolerance 0.01 in ε): its σ and time, "fails" where it raises "The privacy budget is too low"
(those orders never certify ε below min_α c(α, δ) ≈ 0.10 at δ = 1e-5), and the ε its orders
give at the new RDP σ. `--old-prv` adds the time of Opacus' own PRV ε (eps_error 0.01) at the
new PRV σ (seconds to minutes at seg settings).

    PYTHONPATH=src python bench/calibration.py              # every cell, both accountants
    PYTHONPATH=src python bench/calibration.py --study seg --old-prv
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from dpmed.privacy import accounting

BATCH, ROUNDS = 64, 30
MEDMNIST_TRAIN = {"bloodmnist": 11959, "pneumoniamnist": 4708, "dermamnist": 7007}
XCAL_EPS_BY_CLIENTS = {1: [0.5], 3: [0.5], 10: [0.05, 0.5, 5, 50], 50: [0.5]}
SIGNAL_FRACTION, DELTA = 0.1, 1e-5
SEG_SETS = [("duke", 66, 8, 50), ("umn", 425, 8, 50), ("covidct", 60, 24, 100),
            ("N=1000", 1000, 8, 50), ("N=3000", 3000, 8, 50)]  # fmt: skip


def cells() -> list[tuple[str, str, float, float, float, int]]:
    """(study, origin, ε, δ, q, steps) of every distinct calibration of the paper grid."""
    rows = []
    for name, n in MEDMNIST_TRAIN.items():
        for clients, eps_list in XCAL_EPS_BY_CLIENTS.items():
            per_epoch = math.ceil(n // clients / BATCH)
            q, steps = 1 / per_epoch, ROUNDS * per_epoch
            for eps in eps_list:
                rows.append(("xcal", f"{name}/{clients}", eps, DELTA, q, steps))
                if clients > 1:  # XCal-FL's signal and gradient shares
                    f = SIGNAL_FRACTION
                    rows.append(("xcal", f"{name}/{clients} signal", f * eps, f * DELTA, q, steps))
                    rows.append(
                        ("xcal", f"{name}/{clients} grad", (1 - f) * eps, (1 - f) * DELTA, q, steps)
                    )
    for name, n, batch, epochs in SEG_SETS:
        q = min(1.0, batch / n)
        rows.append(("seg", name, 200.0, DELTA, q, epochs * int(1 / q)))
    rows += [("fets", "server", eps, DELTA, 1.0, 1) for eps in (1.0, 10.0)]
    seen, distinct = set(), []
    for row in rows:
        key = (round(row[2], 12), row[3], row[4], row[5])
        if key not in seen:
            seen.add(key)
            distinct.append(row)
    return distinct


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - start


def _opacus_eps(accountant, sigma: float, q: float, steps: int, delta: float) -> float:
    accountant.history = [(sigma, q, steps)]
    return float(accountant.get_epsilon(delta))


def _opacus_sigma(eps: float, delta: float, q: float, steps: int) -> tuple[str, float]:
    try:
        sigma, seconds = _timed(
            get_noise_multiplier, target_epsilon=eps, target_delta=delta, sample_rate=q,
            steps=steps, accountant="rdp", epsilon_tolerance=0.01,
        )  # fmt: skip
    except ValueError:
        return "fails", math.nan
    return f"{sigma:.4f}", seconds


def _clear_caches() -> None:
    for cached in (accounting._calibrate_rdp, accounting._calibrate_prv, accounting._prv_epsilon):
        cached.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=["xcal", "seg", "fets"])
    parser.add_argument("--old-prv", action="store_true", help="time Opacus' own PRV epsilon")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    head = (
        f"{'study':5} {'cell':26} {'eps':>6} {'delta':>7} {'q':>6} {'T':>5} | rdp: {'sigma':>8} "
        f"{'s':>4} {'eps':>9} | prv: {'sigma':>8} {'s':>4} {'eps':>9} | {'prv eps s':>9} | "
        f"old: {'sigma':>8} {'s':>4} {'eps@rdp':>9}"
        + (f" | {'old prv s':>9}" if args.old_prv else "")
    )
    print(head)
    print("-" * len(head))
    for study, origin, eps, delta, q, steps in cells():
        if args.study and study != args.study:
            continue
        _clear_caches()
        sigma_rdp, t_rdp = _timed(accounting.noise_multiplier, eps, delta, q, steps, "rdp")
        eps_rdp = accounting.epsilon([(sigma_rdp, q, steps)], delta, "rdp")
        _clear_caches()
        _, t_report = _timed(accounting.epsilon, [(sigma_rdp, q, steps)], delta, "prv")
        _clear_caches()
        sigma_prv, t_prv = _timed(accounting.noise_multiplier, eps, delta, q, steps, "prv")
        eps_prv = accounting.epsilon([(sigma_prv, q, steps)], delta, "prv")
        old_sigma, t_old = _opacus_sigma(eps, delta, q, steps)
        old_eps = _opacus_eps(RDPAccountant(), sigma_rdp, q, steps, delta)
        line = (
            f"{study:5} {origin:26} {eps:6.3g} {delta:7.1e} {q:6.4f} {steps:5d} | "
            f"{sigma_rdp:13.4f} {t_rdp:4.2f} {eps_rdp:9.6g} | {sigma_prv:13.4f} {t_prv:4.2f} "
            f"{eps_prv:9.6g} | {t_report:9.2f} | {old_sigma:>13} {t_old:4.2f} {old_eps:9.6g}"
        )
        if args.old_prv:
            _, t_old_prv = _timed(_opacus_eps, PRVAccountant(), sigma_prv, q, steps, delta)
            line += f" | {t_old_prv:9.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
