"""The claims families on the paper config (config/config.yaml): every registered claim's run
files planted for every job of the paper grid (random values), read by the studies' own
readers and judged by `dpmed.report.claims`. Holm's correction runs over each claim's own
deciding cells — not over a study's every row, which on this grid needed |t| > 120 from three
seeds — and each family stays small enough for the grid's seeds to decide a clear effect."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpmed.config.checks import check_config, load_config_file
from dpmed.registry import resolve
from dpmed.report.claims import ALPHA, claims_tables, holm
from dpmed.studies import STUDIES, claims_reader

# the largest family the paper grid's three seeds can decide: a paired effect 10 SDs of the
# differences passes the first Holm step (two-sided t, 2 degrees of freedom)
MAX_FAMILY = max(
    k for k in range(1, 100) if 10 * math.sqrt(3) > stats.t.ppf(1 - ALPHA / (2 * k), 2)
)


def _plant(path: Path, wildcards: dict[str, str], rng: np.random.Generator) -> None:
    """A run file of `path`'s kind with random values in every field a claims reader reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    value = lambda: float(rng.uniform(0.3, 0.9))  # noqa: E731
    if path.suffix == ".csv" and path.name == "rounds.csv":
        rounds = pd.DataFrame({"round": range(21)} | {f"dice_{r}": rng.uniform(0.3, 0.9, 21)
                                                     for r in ("ET", "TC", "WT")})  # fmt: skip
        rounds.to_csv(path, index=False)
    elif path.suffix == ".csv":
        pd.DataFrame({"step": range(3), "cosine": rng.uniform(0.1, 0.9, 3)}).to_csv(path)
    elif path.name == "resources.json":
        use = {"wall_clock_s": 100 * value(), "peak_rss_mb": 1e3 * value(),
               "energy_wh": 10 * value(), "energy_method": "cpu"}  # fmt: skip
        path.write_text(json.dumps(use))
    else:
        keys = ("dice", "val_dice", "hd95", "auc", "dice_ET", "dice_TC", "dice_WT",
                "convergence_score", "dice_WT_round0", "f1", "road", "f1_per_eps",
                "road_per_eps", "step_seconds")  # fmt: skip
        metrics = {key: value() for key in keys} | {"train_seconds": 60.0, "epochs": 2}
        metrics["f1"] = float(rng.uniform(0.8, 0.95))  # above chance (1.5/K) for every K
        path.write_text(json.dumps(metrics | {"wildcards": wildcards}))


@pytest.fixture(scope="module")
def paper_tables(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("paper")
    config = load_config_file(Path(__file__).parents[1] / "config" / "config.yaml")
    grid = check_config(config, Path(__file__).parents[1] / "config" / "schema.yaml")
    rng = np.random.default_rng(0)
    studies = {}
    for name, spec in STUDIES.items():
        jobs = grid.jobs(name)
        if not spec.claims or not jobs:
            continue
        by_path = {job.path: dict(job.wildcards) for job in jobs}
        inputs = {key: [str(root / f) for f in files]
                  for key, files in spec.claims(jobs).items()}  # fmt: skip
        for files in inputs.values():
            for file in files:
                run = next(p for p in (Path(file).parent, Path(file).parents[1])
                           if str(p.relative_to(root)) in by_path)  # fmt: skip
                _plant(Path(file), by_path[str(run.relative_to(root))], rng)
        studies[name] = resolve(claims_reader(name))(**inputs)  # (claims, observations)
    return claims_tables(studies)


def test_holm_runs_over_each_claims_deciding_cells(paper_tables):
    cells = paper_tables.cells
    sizes = {}
    for claim, mine in cells[cells["decides"].astype(bool)].groupby("claim"):
        assert mine["p_holm"].tolist() == pytest.approx(holm(mine["p"].tolist()), nan_ok=True)
        sizes[claim] = int(np.isfinite(mine["p"]).sum())
    study_rows = cells.groupby("study")["p"].apply(lambda p: int(np.isfinite(p).sum()))
    print("families:", dict(sorted(sizes.items(), key=lambda kv: -kv[1])), "study rows:",
          study_rows.to_dict())  # fmt: skip
    assert max(sizes.values()) <= MAX_FAMILY, sizes
