"""The one-run privacy audit beyond the demo: white-box settings where it can be tight, for the
sound mechanisms and the paper recipes (issue 17, "Done when").

Every row retrains one cell through its study's own code (`dpmed.audit.audit_cell`)
on the smoke config's synthetic data and hyperparameters, with m canaries, and prints the
measured ε lower bound (95 %) beside the ε the run claims. The settings favour the auditor:

- seg (duke, U-Net width 4, depth 2): SGD with momentum (Adam rescales every coordinate, which
  the Dirac score does not model), lr 0.05, batch 32 ≥ the 18 training images (q = 1: an
  included canary is in every step, so the final model is one Gaussian mechanism of the
  canary's sum, and its score is that mechanism's sufficient statistic), 40 epochs = 40 DP
  steps; Dirac gradient canaries. Rows: flat clipping (sound), NSGD with its public code's
  noise σ·r/C (`paper-noise`), batch-level adaptive DP-Morph v1 (flat clipping).
- xcal (bloodmnist, ResNet-18 width 1/8, 1 client: averaging K clients' models divides a
  canary's signal by K and the noise by √K only): batch ≥ the client's data (q = 1), 3 rounds
  of 1 local epoch; Dirac gradient canaries; static DP-SGD (sound).
- fets (33 tiny collaborators, 6 per round, 3D U-Net width 2): one round, so the canaries see
  exactly one Gaussian mechanism; canary collaborators sending ±C Dirac updates. Rows: sound
  DP-FedAvg, sound DP-SimAgg, DP-SimAgg paper mode (ε0 = the claimed ε of one round).

Claimed ε ∈ {1, 4} (fets: ε0 of its one round); m = 1000 and 5000 canaries (`--canaries`).
About 3 minutes on 2 CPU cores.

    PYTHONPATH=src nice python bench/privacy_audit.py [--canaries 1000 5000] [--eps 1 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import yaml

from dpmed.audit import audit_cell
from dpmed.config.checks import check_config, load_configs
from dpmed.config.grid import job_seed
from dpmed.data.stage import preprocess, synthesize
from dpmed.runtime import JobContext

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "config" / "smoke.yaml"
SEG = {"optimizer": "sgd", "lr": 0.05, "epochs": 40, "width": 4, "depth": 2, "batch_size": 32}
XCAL = {"rounds": 3, "local_epochs": 1, "batch_size": 64, "clients_per_round": 3}
FETS = {"rounds": 1, "base_filters": 2, "patches_per_subject": 2}
# (study, cell wildcards without eps, setting, parameter overrides)
ROWS = (
    ("seg", {"dataset": "duke", "model": "unet", "clip": "flat", "morph": "none"}, "gradient", SEG),
    ("seg", {"dataset": "duke", "model": "unet", "clip": "nsgd", "morph": "none"}, "paper-noise",
     SEG),
    ("seg", {"dataset": "duke", "model": "unet", "clip": "flat", "morph": "adaptive-v1"},
     "gradient", SEG),
    ("xcal", {"dataset": "bloodmnist", "model": "resnet18", "method": "static", "shift": "iid",
              "clients": "1"}, "gradient", XCAL),
    ("fets", {"aggregator": "dp_fedavg", "dpmode": "sound"}, "update", FETS),
    ("fets", {"aggregator": "dp_simagg", "dpmode": "sound"}, "update", FETS),
    ("fets", {"aggregator": "dp_simagg", "dpmode": "paper"}, "update", FETS),
)  # fmt: skip
COLUMNS = ("study", "mechanism", "setting", "guarantee", "eps_claimed", "eps_lower",
           "lower/claimed", "m", "k", "correct", "seconds")  # fmt: skip


def processed(dataset: str, config: dict, root: Path) -> Path:
    """The smoke config's synthetic `dataset`, processed under `root` (made once)."""
    out = root / dataset / "processed"
    if not out.exists():
        cfg = config["data"][dataset]
        if dataset == "fets":
            from dpmed.data import fets
            from dpmed.data.synthetic import fets as synthetic_fets

            synthetic_fets.generate(root / dataset / "raw", "fets", cfg, seed=0)
            fets.preprocess(root / dataset / "raw", out, "fets", cfg)
        else:
            synthesize(dataset, cfg, root / dataset / "raw")
            preprocess(dataset, cfg, root / dataset / "raw", out)
    return out


def row(
    study: str,
    cell: dict[str, str],
    setting: str,
    overrides: dict,
    eps: str,
    canaries: int,
    args: argparse.Namespace,
    grid: Any,
    raw: dict,
) -> list[str]:
    """Audit one cell at claimed ε (fets: ε0) `eps` with `canaries` canaries: the table row."""
    wc = {**cell, "eps": eps, "seed": "0"}
    params = grid.params(study, wc) | overrides
    data = processed(wc.get("dataset", "fets"), raw, args.out / "data")
    out = args.out / study / "_".join(wc.values()) / setting
    job = JobContext(data, out, wc, params, job_seed(study, wc), "cpu", threads=1)
    start = time.time()
    audit = audit_cell(study, job, setting, canaries)
    r = audit.result
    values = (study, audit.mechanism, setting, audit.guarantee, f"{audit.eps_claimed:.3f}",
              f"{r.eps_lower:.3f}", f"{r.eps_lower / audit.eps_claimed:.2f}", r.canaries,
              f"{r.k_pos}+{r.k_neg}", f"{r.correct}/{r.guesses}",
              f"{time.time() - start:.0f}")  # fmt: skip
    return [str(v) for v in values]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--canaries", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--eps", nargs="+", default=["1", "4"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/dpmed_privacy_audit"))
    args = parser.parse_args()
    config = load_configs([str(SMOKE)])
    grid = check_config(config, REPO / "config" / "schema.yaml")
    raw = yaml.safe_load(SMOKE.read_text())
    print(" | ".join(COLUMNS))
    for canaries in args.canaries:
        for study, cell, setting, overrides in ROWS:
            for eps in args.eps:
                values = row(study, cell, setting, overrides, eps, canaries, args, grid, raw)
                print(" | ".join(values), flush=True)


if __name__ == "__main__":
    main()
