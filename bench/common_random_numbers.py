"""Variance reduction of common random numbers on the demo's seeded seg cells.

Trains the demo's Duke UNet cells (config/smoke.yaml: data.duke and the first seg block's
params) for `--seeds` seeds under two seedings, side by side in one run:

- `independent`: every source of randomness from the job seed, a hash of every wildcard (the
  scheme before common random numbers: seed s of flat and seed s of NSGD share nothing);
- `common`: initial weights and Poisson batches from the seed block's common seed
  (`dpmed.config.grid.common_seed`), noise from the job seed (what the pipeline runs).

For each compared pair (`--pairs` of `clip/eps[/morph]` arms, e.g. NSGD vs flat at ε 50, flat
at ε 50 vs non-private, closing vs no morphology without DP) it
prints, per seeding, the mean per-seed difference in test Dice, the width of its 95 %
t-interval over seeds (the paired interval the tables' tests rest on), the width of the
unpaired (Welch) interval of the same difference, the correlation of the two arms over seeds
(what pairing can remove: the paired variance is var(a) + var(b) − 2 cov(a, b)), and the ratio
of the paired widths common / independent.

    PYTHONPATH=src python bench/common_random_numbers.py --seeds 6
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import yaml
from scipy import stats

from dpmed.config.grid import job_seed
from dpmed.data.stage import preprocess, synthesize
from dpmed.runtime import JobContext
from dpmed.seeding import stable_seed
from dpmed.seg import run as seg_run

REPO = Path(__file__).resolve().parents[1]
PAIRS = ["nsgd/50:flat/50", "flat/50:none/inf", "none/inf/close-k3:none/inf"]


def independent_seed(study: str, wildcards: Mapping[str, str], role: str) -> int:
    """The old scheme: a source's seed hashes every wildcard (the compared factor included)."""
    return stable_seed(study, role, job_seed(study, wildcards))


def demo_duke(root: Path) -> tuple[str, dict]:
    """The demo's processed Duke data under `root` and the learning cells' params."""
    config = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    cfg = config["data"]["duke"]
    synthesize("duke", cfg, root / "raw")
    preprocess("duke", cfg, root / "raw", root / "processed")
    params = config["seg"]["defaults"] | config["seg"]["grid"][0]["params"]
    return str(root / "processed"), params


def test_dice(processed: str, out: Path, params: dict, arm: str, seed: int) -> float:
    """Test Dice of the demo's Duke UNet run of `arm` (`clip/eps[/morph]`) and `seed`."""
    clip, eps, morph = (arm.split("/") + ["none"])[:3]
    wc = dict(dataset="duke", model="unet", clip=clip, morph=morph, eps=eps, seed=str(seed))
    job = JobContext(Path(processed), out, wc, dict(params), job_seed("seg", wc), "cpu")
    return float(seg_run.run(job)["dice"])


def interval_width(values: np.ndarray) -> float:
    """Width of the 95 % t-interval of the mean of `values`."""
    half = stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
    return float(2 * half)


def welch_width(a: np.ndarray, b: np.ndarray) -> float:
    """Width of the 95 % Welch interval of mean(a) − mean(b), the samples taken as unpaired."""
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return float(2 * stats.t.ppf(0.975, df) * math.sqrt(va + vb))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument(
        "--pairs", nargs="+", default=PAIRS, help="clip/eps[/morph]:clip/eps[/morph]"
    )
    args = parser.parse_args()
    arms = sorted({arm for pair in args.pairs for arm in pair.split(":")})
    original = seg_run.common_seed
    with tempfile.TemporaryDirectory() as tmp:
        processed, params = demo_duke(Path(tmp))
        dice: dict[tuple[str, str], np.ndarray] = {}
        for seeding, source in (("independent", independent_seed), ("common", original)):
            seg_run.common_seed = source
            for arm in arms:
                dice[seeding, arm] = np.array([
                    test_dice(processed, Path(tmp) / seeding / arm / str(s), params, arm, s)
                    for s in range(args.seeds)
                ])  # fmt: skip
                print(f"{seeding:11s} {arm:17s} Dice per seed {np.round(dice[seeding, arm], 4)}")
        seg_run.common_seed = original
    print(f"\n{args.seeds} seeds; widths of 95 % intervals of the difference in test Dice")
    print(f"{'pair':30s} {'seeding':11s} {'mean diff':>9s} {'paired':>8s} {'unpaired':>8s} "
          f"{'corr':>6s}")  # fmt: skip
    for pair in args.pairs:
        arm, base = pair.split(":")
        widths = {}
        for seeding in ("independent", "common"):
            a, b = dice[seeding, arm], dice[seeding, base]
            widths[seeding] = interval_width(a - b)
            print(f"{arm + ' - ' + base:30s} {seeding:11s} {np.mean(a - b):9.4f} "
                  f"{widths[seeding]:8.4f} {welch_width(a, b):8.4f} "
                  f"{np.corrcoef(a, b)[0, 1]:6.2f}")  # fmt: skip
        print(f"{'':30s} paired width common / independent: "
              f"{widths['common'] / widths['independent']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
