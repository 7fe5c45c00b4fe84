"""`privacy.json`: what every training output says about its privacy.

`guarantee` is "dp" when the run satisfies the stated (ε, δ) formally, "paper-approximation"
when it reproduces a paper's unsound recipe (the `reasons` say why, docs/privacy.md), and
"none" for non-private runs (ε = null). `covers` says what a guarantee protects (typically the
released model) and `not_covered` lists what the run writes beside it outside the mechanism;
the runs keep such diagnostics in a diagnostics/ folder, never to be released with a DP model.
`extra.noise_source` says whether the noise was seeded (a reproducible simulation) or drawn
from OS entropy (`dpmed.privacy.mechanisms`). `privacy_unit`, added when the record is written,
says what one record of the adjacency is in the run's dataset (one B-scan, one image, one
collaborator) and what that means for a patient.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dpmed.io import write_json

GUARANTEES = ("dp", "paper-approximation", "none")
NOTHING_COVERED = "every file of the run folder: a non-private run (no clipping, no noise)"


@dataclass(frozen=True)
class PrivacyRecord:
    """The privacy facts of one run.

    mechanism: e.g. "DP-SGD, Poisson-subsampled Gaussian, flat clipping";
    adjacency: "sample-level (add/remove one image)" or "collaborator-level (...)";
    sampling: "poisson", "fixed-size", "all" or "none";
    noise_multipliers: the σ (noise std / sensitivity) used, one per distinct stretch;
    epsilon: the accountant's ε at `delta` (None when non-private);
    epsilon_by_accountant: every ε computed for the same run, e.g. {"rdp": .., "prv": ..};
    covers: what the guarantee protects, e.g. "the released model weights" (empty only for a
        non-private run);
    not_covered: the files (or columns) written beside the record that the guarantee does not
        cover, each "<files and columns>: <why>", the files relative to the run folder.
    """

    mechanism: str
    adjacency: str
    sampling: str
    accountant: str
    epsilon: float | None
    delta: float | None
    guarantee: str
    clip_norm: float | None = None
    sample_rate: float | None = None
    steps: int | None = None
    noise_multipliers: list[float] = field(default_factory=list)
    target_epsilon: float | None = None
    epsilon_by_accountant: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    covers: str = ""
    not_covered: list[str] = field(default_factory=list)
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.guarantee not in GUARANTEES:
            raise ValueError(f"guarantee must be one of {GUARANTEES}, got {self.guarantee!r}")
        if self.guarantee == "paper-approximation" and not self.reasons:
            raise ValueError("a paper-approximation needs the reasons it is not a formal guarantee")
        if (self.epsilon is None) != (self.guarantee == "none"):
            raise ValueError("epsilon is None exactly when the run is non-private")
        if self.guarantee != "none" and not self.covers:
            raise ValueError("a private record must say what its guarantee covers")

    @classmethod
    def non_private(
        cls, mechanism: str, adjacency: str, sampling: str, **fields: Any
    ) -> PrivacyRecord:
        """The record of a run without noise: no accountant, ε and δ null, guarantee "none",
        nothing covered."""
        return cls(
            mechanism=mechanism,
            adjacency=adjacency,
            sampling=sampling,
            accountant="none",
            epsilon=None,
            delta=None,
            guarantee="none",
            not_covered=[NOTHING_COVERED],
            **fields,
        )

    def write(self, path: str | Path, dataset: str) -> None:
        """Write the record of a run on `dataset` as `privacy.json` (atomic, key-sorted), with
        the dataset's privacy unit."""
        from dpmed.data.registry import privacy_unit

        write_json(path, {**asdict(self), "privacy_unit": privacy_unit(dataset)})
