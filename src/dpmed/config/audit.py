"""The config's `audit` block: which private grid cells get the one-run empirical privacy audit
(Steinke, Nasr & Jagielski 2023; `dpmed.audit`), in which settings and at which noise
scales.

    audit:
      canaries: 1000             # m, for every cell unless the cell sets its own
      confidence: 0.95
      cells:
        - run: results/seg/duke/unet/flat/none/eps200/seed0   # a run folder of the grid
          settings: [gradient]                                 # the study's audit settings
          noise_scales: [1, 0.1, 0]                            # 1 = as configured

Each (cell, setting, noise scale) is one `privacy_audit` job: it retrains the cell with its
grid hyperparameters and job seed (`dpmed.config.grid.job_seed`, so the audited run is the
cell's run plus canaries) and writes `audit.json` into

    results/audit/<study>/<run folder below results/<study>/>/<setting>/noise<scale>/

(`AuditJob.path`). A cell must be a private job of its study's grid (finite ε) and a setting
one the study's audit offers (`StudySpec.audit_settings`, torch-free so parsing stays fast);
anything else is a `ConfigError` naming the key (`audit.cells[2].settings[0]`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpmed.config.grid import Grid, wildcards_from_path
from dpmed.config.study import Wildcards
from dpmed.config.wildcards import NUMBER_PATTERN, format_eps
from dpmed.errors import ConfigError
from dpmed.studies import STUDIES

# The file each audit job writes (`dpmed.audit.audit_cell`).
AUDIT_FILE = "audit.json"
AUDIT_ROOT = "results/audit"
# The audit job's folder; `cell` is the audited run folder below results/<study>/.
AUDIT_PATH = AUDIT_ROOT + "/{study}/{cell}/{setting}/noise{noise}"
AUDIT_PATTERNS = {
    "study": "|".join(STUDIES),
    "cell": r".+",
    "setting": r"[A-Za-z0-9_-]+",
    "noise": NUMBER_PATTERN,
}
# Datasets of studies without a `dataset` wildcard (a fets cell reads the FeTS data).
STUDY_DATASET = {"fets": "fets"}


@dataclass(frozen=True)
class AuditJob:
    """One `privacy_audit` job.

    Args:
        study: the audited cell's study.
        wildcards: the cell's wildcards, in axis order.
        setting: the canary setting (e.g. `gradient`, `input`).
        noise_scale: factor on the noise std the run adds (1: as configured; the claimed ε
            stays that of the configured noise).
        canaries: m, the number of canaries.
        confidence: the confidence of the lower bound (e.g. 0.95).
    """

    study: str
    wildcards: Wildcards
    setting: str
    noise_scale: float
    canaries: int
    confidence: float

    @property
    def wc(self) -> dict[str, str]:
        return dict(self.wildcards)

    @property
    def run(self) -> str:
        """The audited run folder, e.g. `results/seg/duke/unet/flat/none/eps50/seed0`."""
        return STUDIES[self.study].path.format(**self.wc)

    @property
    def rule_wildcards(self) -> dict[str, str]:
        """The `privacy_audit` rule's wildcards of this job."""
        return {
            "study": self.study,
            "cell": self.run.removeprefix(f"results/{self.study}/"),
            "setting": self.setting,
            "noise": format_eps(self.noise_scale),
        }

    @property
    def path(self) -> str:
        """The job's folder (`AUDIT_PATH`)."""
        return AUDIT_PATH.format(**self.rule_wildcards)

    @property
    def dataset(self) -> str:
        """The dataset the cell trains on."""
        return self.wc.get("dataset") or STUDY_DATASET[self.study]


def rule_job(config: Mapping[str, Any], wildcards: Mapping[str, str]) -> AuditJob:
    """The audit job of the `privacy_audit` rule's wildcards (`AUDIT_PATTERNS`): the cell's
    wildcards parsed from `cell`, its canaries from its `audit.cells` entry (the block's
    `canaries` for a cell the block does not list, asked for by its path)."""
    study = wildcards["study"]
    run = f"results/{study}/{wildcards['cell']}"
    cell = wildcards_from_path(study, run)
    block = config["audit"]
    listed = [c.get("canaries") for c in block["cells"] if c["run"].rstrip("/") == run]
    canaries = next((m for m in listed if m is not None), block["canaries"])
    return AuditJob(
        study,
        tuple((wc, cell[wc]) for wc in STUDIES[study].wildcards),
        wildcards["setting"],
        float(wildcards["noise"]),
        int(canaries),
        float(block["confidence"]),
    )


def audit_jobs(config: Mapping[str, Any], grid: Grid) -> list[AuditJob]:
    """Every audit job of the validated `config`'s `audit` block, in config order.

    Raises ConfigError naming the key when a cell is not a run folder of a study grid, is not
    private (ε inf), names a study without an audit or a setting its audit lacks, or repeats a
    (cell, setting, noise scale) of an earlier entry.
    """
    block = config.get("audit") or {}
    cells = block.get("cells") or []
    if not cells:
        return []
    jobs: dict[tuple[str, str, float], AuditJob] = {}
    for index, cell in enumerate(cells):
        key = f"audit.cells[{index}]"
        study, wildcards = _cell_of(grid, cell["run"], f"{key}.run")
        settings = STUDIES[study].audit_settings
        if not settings:
            audited = [name for name, spec in STUDIES.items() if spec.audit_settings]
            raise ConfigError(
                f"{key}.run",
                f"study {study} has no privacy audit (audits exist for {', '.join(audited)})",
            )
        canaries = int(cell.get("canaries", block["canaries"]))
        for s_index, setting in enumerate(cell["settings"]):
            if setting not in settings:
                raise ConfigError(
                    f"{key}.settings[{s_index}]",
                    f"{study} audits have settings {', '.join(settings)}, not {setting!r}",
                )
            for scale in cell["noise_scales"]:
                job = AuditJob(
                    study, wildcards, setting, float(scale), canaries, float(block["confidence"])
                )
                identity = (job.run, setting, job.noise_scale)
                if identity in jobs:
                    raise ConfigError(
                        key,
                        f"{job.run} {setting} at noise scale {scale:g} is audited twice; "
                        "list each (run, setting, noise scale) once",
                    )
                jobs[identity] = job
    return list(jobs.values())


def _cell_of(grid: Grid, run: str, key: str) -> tuple[str, Wildcards]:
    """(study, wildcards) of the grid job whose run folder is `run`."""
    run = run.rstrip("/")
    for study in STUDIES:
        for job in grid.jobs(study):
            if job.path == run:
                if math.isinf(float(job.wc["eps"])):
                    raise ConfigError(key, f"{run} is not private (eps inf): nothing to audit")
                return study, job.wildcards
    prefixes = ", ".join(f"results/{name}/..." for name in STUDIES)
    raise ConfigError(
        key,
        f"{run} is not a run folder of any study grid ({prefixes}, as the training rule "
        "names it); audit a cell the grid runs",
    )
