"""The privacy audit runner: one audited training run of a private grid cell (a measured ε lower
bound beside the claimed ε), its dispatcher and command line. It sits above the config and the
study registry; `dpmed.privacy.audit` holds the mechanism-side parts (bound, canaries).

The cell trains through its study's own code path with canaries added, then `best_audit` turns
the canaries' scores into the one-run lower bound (`dpmed.privacy.audit.bound`) at the run's δ.
A study's audit is its optional module `dpmed.<study>.audit` (its `audit_cell`, imported only
here) and the settings its spec offers (`StudySpec.audit_settings`), each setting documented in
that module: seg
offers `gradient` (white-box Dirac gradient canaries), `input` (held-out images with
class-shifted masks) and `paper-noise` (Dirac canaries on the run with the clip rule's
public-code noise scale, e.g. NSGD's σ·r/C); xcal `gradient` and `input` (held-out images with
a wrong label); fets `update` (canary collaborators sending ±C Dirac updates, scored on the
released global model).

The claimed ε and the guarantee are the run's own privacy record; for a `paper-approximation`
cell the audit measures what its ε would claim. `noise_scale` multiplies the noise std actually
added while the claimed ε stays that of the calibrated noise: 1 is the run as configured, 0 and
0.1 are the controls that show the audit's power (no noise, a tenth of the noise). Audits need
no checkpoint: a killed audit reruns from the start. `audit_cell` writes one audit.json per
cell; `main` is its command line for a cell of a config's grid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from dpmed.config.audit import AUDIT_FILE
from dpmed.io import write_json
from dpmed.privacy.audit.cell import CellAudit
from dpmed.runtime import JobContext
from dpmed.studies import STUDIES, study_part


def audited_studies() -> list[str]:
    """The registered studies that offer an audit, in registry order."""
    return [name for name, spec in STUDIES.items() if spec.audit_settings]


def study_runner(study: str) -> Callable[..., CellAudit]:
    """The audit runner of `study` (`dpmed.<study>.audit:audit_cell`), imported now."""
    return study_part(study, "audit", "audit_cell")


def audit_cell(
    study: str,
    job: JobContext,
    setting: str,
    canaries: int,
    confidence: float = 0.95,
    noise_scale: float = 1.0,
) -> CellAudit:
    """Audit one cell of `study` in `setting` (its audit refuses a setting it does not offer)
    and write `audit.json` into the job's folder; returns the audit."""
    audit = study_runner(study)(job, setting, canaries, confidence, noise_scale)
    write_json(Path(job.out_dir) / AUDIT_FILE, audit.record())
    return audit


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m dpmed.audit --config C [--config C2] RUN --study S --setting X
    --canaries M --out DIR`: audit the grid cell whose run folder is RUN (e.g.
    results/seg/duke/unet/flat/none/eps50/seed0) with the hyperparameters, job seed and device
    the config gives its training job; writes DIR/audit.json and prints its summary."""
    import argparse

    from dpmed.config.checks import check_config, load_configs
    from dpmed.config.grid import job_seed, wildcards_from_path
    from dpmed.install import workflow_file

    parser = argparse.ArgumentParser(prog="python -m dpmed.audit")
    parser.add_argument("run", help="the cell's run folder, as its training rule names it")
    parser.add_argument("--config", action="append", default=[], help="config file(s)")
    parser.add_argument("--study", choices=audited_studies(), required=True)
    parser.add_argument("--setting", default="gradient")
    parser.add_argument("--canaries", type=int, required=True)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--noise-scale", type=float, default=1.0)
    parser.add_argument("--processed", help="processed data folder (data/processed/<dataset>)")
    parser.add_argument("--out", required=True, help="folder for audit.json")
    args = parser.parse_args(argv)
    config = load_configs(args.config)
    grid = check_config(config, workflow_file("config/schema.yaml"))
    wildcards = wildcards_from_path(args.study, args.run)
    # fets cells have no dataset wildcard: their data is data/processed/fets
    processed = args.processed or f"data/processed/{wildcards.get('dataset', args.study)}"
    job = JobContext(
        Path(processed),
        Path(args.out),
        wildcards,
        grid.params(args.study, wildcards),
        job_seed(args.study, wildcards),
        config["device"],
    )
    audit = audit_cell(
        args.study, job, args.setting, args.canaries, args.confidence, args.noise_scale
    )
    result = audit.result
    print(
        f"{args.study} {audit.mechanism} {audit.setting}: eps_lower {result.eps_lower:.4g} "
        f"(claimed {audit.eps_claimed:.4g}, {audit.guarantee}; {result.correct}/"
        f"{result.guesses} correct of {result.canaries} canaries, {result.confidence:.0%})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
