"""One audited training run of a private seg or xcal grid cell (issue 17: a measured ε lower
bound beside the claimed ε).

The cell trains through its study's own code path (`dpmed.seg.run`, `dpmed.xcal.run` and
`dpmed.xcal.client`) with canaries added, then `best_audit` turns the canaries' scores into the
one-run lower bound (`dpmed.privacy.audit.bound`) at the run's δ. Two settings:

- `gradient` (seg and xcal): white-box Dirac canaries (`dpmed.privacy.audit.dirac`) joining the
  DP step's per-sample gradients, each included with probability ½ and then Poisson-sampled at
  the data's rate q; score ⟨e_c, θ_0 − θ_T⟩. Their norm is the one the clip rule lets through
  largest (`canary_norm`), so the audit measures the rule's worst case. In xcal, canary j
  belongs to client j mod K (sampled at that client's q) and θ is the global model; XCal-FL's
  signal step does not see the canaries (a record whose signal is 0, a value it may take).
- `input` (xcal): black-box mislabelled images. m images the run never trains on (the val and
  test splits, drawn without replacement) get a uniformly drawn wrong label; each is added with
  probability ½ to the training data of client j mod K (whose size, and so q = 1/⌈n/B⌉, grows
  with it, as for any added record); score −CE of the final global model on the wrong label.

The claimed ε and the guarantee are the run's own privacy record (`seg_privacy_record`,
`xcal.privacy.privacy_record`); for a `paper-approximation` cell the audit measures what its ε
would claim. `noise_scale` multiplies the noise std actually added while the claimed ε stays
that of the calibrated σ: 1 is the run as configured, 0 and 0.1 are the controls that show the
audit's power (no noise, a tenth of the noise). Audits need no checkpoint: a killed audit
reruns from the start. `audit_cell` writes one audit.json per cell; `main` is its command line
for a cell of a config's grid.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpmed.io import write_json
from dpmed.privacy.audit.bound import AuditResult, best_audit
from dpmed.privacy.audit.dirac import DiracCanaries
from dpmed.privacy.dpsgd import opacus_clip_factors, trainable
from dpmed.runtime import JobContext
from dpmed.seeding import stable_seed

if TYPE_CHECKING:
    from dpmed.xcal.run import Federation

SETTINGS = {"seg": ("gradient",), "xcal": ("gradient", "input")}
AUDIT_FILE = "audit.json"
# Canary norms tried, in units of C: a rule whose n·s(n) grows with n (NSGD, AUTO-S, PSAC)
# lets a larger gradient through larger, up to C.
NORM_MULTIPLES = (1.0, 10.0, 100.0, 1000.0)
SCORE_BATCH = 256


@dataclass(frozen=True)
class CellAudit:
    """The audit of one cell: what ran, what it claims and what the canaries measured.

    Args:
        study: `seg` or `xcal`.
        mechanism: the cell's mechanism (seg: `clip/morph`, xcal: the method).
        setting: `gradient` or `input`.
        guarantee: the run's privacy record's guarantee (`dp`, `paper-approximation`).
        eps_claimed: the record's ε at `result.delta`, for the calibrated σ.
        noise_scale: the factor on the noise std actually added (1: as configured).
        canary_norm: the Dirac canaries' gradient norm (None for input canaries).
        wildcards: the cell.
        result: the one-run audit.
    """

    study: str
    mechanism: str
    setting: str
    guarantee: str
    eps_claimed: float
    noise_scale: float
    canary_norm: float | None
    wildcards: dict[str, str]
    result: AuditResult

    def record(self) -> dict[str, Any]:
        """audit.json's content: the fields above with the result's flattened in."""
        fields = {k: v for k, v in asdict(self).items() if k != "result"}
        return fields | asdict(self.result)


def canary_norm(factors: Callable[[torch.Tensor], torch.Tensor], clip_norm: float) -> float:
    """The gradient norm n among `NORM_MULTIPLES`·C whose scaled norm n·s(n) is largest (the
    smallest such n on ties): the strongest Dirac canary the rule lets through."""
    norms = torch.tensor(NORM_MULTIPLES, dtype=torch.float64) * clip_norm
    scaled = norms * factors(norms)
    return float(norms[int(torch.argmax(scaled))])


def _generator(job: JobContext, *parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(stable_seed(job.seed, "privacy-audit", *parts))


# ---------------------------------------------------------------------------------- seg


def audit_seg_cell(
    job: JobContext, canaries: int, confidence: float = 0.95, noise_scale: float = 1.0
) -> CellAudit:
    """Train the private seg cell of `job` with `canaries` Dirac canaries and audit it.

    The run is `dpmed.seg.run`'s (plan, network, optimizer, DP-SGD setup, epochs), the canaries
    entering every DP step through `Setup.inject`, empty Poisson batches included; ghost
    clipping keeps no per-sample gradients and is refused.
    """
    from dpmed.seg import run as seg_run
    from dpmed.seg.data import load_seg_data
    from dpmed.seg.privacy import seg_privacy_record

    device = job.start()
    data = load_seg_data(job.processed_dir, job.wildcards["dataset"])
    plan = seg_run.Plan.of(job, data)
    if not plan.private:
        raise ValueError(f"seg cell {job.wildcards} is not private: nothing to audit")
    if plan.mode == "ghost":
        raise ValueError("ghost clipping keeps no per-sample gradients for Dirac canaries")
    net, _ = seg_run.build_network(job, data, device)
    optimizer = seg_run.make_optimizer(net, job.params)
    state = seg_run.TrainState()
    sampler = torch.Generator().manual_seed(job.seed)  # the runner's sampling generator
    setup = seg_run.make_setup(plan, net, optimizer, data, sampler, state)
    setup.dp.optimizer.noise_multiplier = setup.sigma * noise_scale
    params = setup.dp.optimizer.params
    norm = canary_norm(plan.rule.factors, plan.rule.clip_norm)
    generator = _generator(job, "gradient")
    dirac = DiracCanaries.draw(params, canaries, norm, plan.q, generator)
    setup.inject = lambda ps: dirac.inject(ps, dirac.step_members(generator))
    before = [p.detach().clone() for p in params]
    net.train()
    for epoch in range(plan.epochs):
        seg_run.train_epoch(setup, plan, state, epoch, device)
    # the accountant recorded the σ actually used; the claim is that of the calibrated σ
    history = [(setup.sigma, q, n) for _, q, n in setup.accountant_history()]
    record = seg_privacy_record(
        True,
        plan.params,
        plan.rule,
        plan.morph,
        plan.q,
        setup.sigma,
        plan.target_eps,
        state.empty_batches,
        plan.mode,
        history,
        len(data.splits["train"]),
    )
    wc = dict(job.wildcards)
    result = best_audit(
        dirac.scores(before, params), dirac.included.numpy(), confidence, record.delta
    )
    return CellAudit(
        "seg",
        f"{wc['clip']}/{wc['morph']}",
        "gradient",
        record.guarantee,
        float(record.epsilon),
        noise_scale,
        norm,
        wc,
        result,
    )


# ---------------------------------------------------------------------------------- xcal


@dataclass
class ClientAudit:
    """A client's `StepAudit`: its Dirac canaries (None: none), sampled at its rate q from
    `generator`, and the factor on the noise std."""

    canaries: DiracCanaries | None
    generator: torch.Generator
    noise_scale: float

    def adjust(
        self,
        model: nn.Module,
        sums: dict[str, torch.Tensor],
        noise_std: dict,
        factors: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[dict[str, torch.Tensor], dict]:
        """The sums plus the step's canary members' clipped gradients; the std scaled."""
        if self.canaries is not None:
            members = self.canaries.step_members(self.generator)
            extra = self.canaries.clipped_sums(trainable(model), members, factors)
            sums = {name: sums[name] + extra[name] for name in sums}
        return sums, {name: std * self.noise_scale for name, std in noise_std.items()}


@dataclass(frozen=True)
class InputCanaries:
    """m mislabelled images: uint8 (m, H, W, C), wrong labels (m,), inclusion (m,)."""

    images: np.ndarray
    labels: np.ndarray
    included: np.ndarray

    @classmethod
    def draw(
        cls, processed_dir: Path, count: int, n_classes: int, generator: torch.Generator
    ) -> InputCanaries:
        """`count` images of the val and test splits (never trained on), drawn without
        replacement, each with a uniformly drawn wrong label and included w.p. ½."""
        from dpmed.xcal.run import load_split

        splits = [load_split(processed_dir, split) for split in ("val", "test")]
        images = np.concatenate([s[0] for s in splits])
        labels = np.concatenate([s[1] for s in splits]).reshape(-1)
        if not 0 < count <= len(labels):
            raise ValueError(f"need 0 < canaries <= {len(labels)} val + test images, got {count}")
        if n_classes < 2:
            raise ValueError("mislabelled canaries need at least 2 classes")
        pick = torch.randperm(len(labels), generator=generator)[:count].numpy()
        shift = torch.randint(1, n_classes, (count,), generator=generator).numpy()
        included = (torch.rand(count, generator=generator) < 0.5).numpy()
        wrong = (labels[pick] + shift) % n_classes
        return cls(images[pick], wrong.astype(labels.dtype), included)

    def add_to(
        self, parts: Sequence[tuple[np.ndarray, np.ndarray]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The clients' (images, labels) with included canary j appended to client j mod K."""
        owner = np.arange(len(self.labels)) % len(parts)
        out = []
        for k, (images, labels) in enumerate(parts):
            mine = self.included & (owner == k)
            out.append(
                (
                    np.concatenate([images, self.images[mine]]),
                    np.concatenate([labels, self.labels[mine]]),
                )
            )
        return out

    def scores(self, net: nn.Module, device: torch.device) -> np.ndarray:
        """−CE of `net` (eval mode) on each canary's wrong label, float64 (m,)."""
        from dpmed.xcal.run import to_tensor

        net.eval()
        losses = []
        with torch.no_grad():
            for start in range(0, len(self.labels), SCORE_BATCH):
                x = to_tensor(self.images[start : start + SCORE_BATCH], device)
                y = torch.from_numpy(self.labels[start : start + SCORE_BATCH]).to(device)
                losses.append(F.cross_entropy(net(x), y, reduction="none").double().cpu())
        return -torch.cat(losses).numpy()


def _dirac_audits(
    job: JobContext, fed: Federation, canaries: int, noise_scale: float
) -> tuple[DiracCanaries, float]:
    """Draw the cell's Dirac canaries over the global model and give every client its own
    (canary j → client j mod K, sampled at the client's q); the canaries and their norm."""
    params = list(trainable(fed.wrapped).values())
    clip_norm = float(job.params["clip_norm"])
    norm = canary_norm(lambda n: opacus_clip_factors(n, clip_norm), clip_norm)
    # q = 1 here: only the coordinates and inclusions are used; each client samples at its q
    dirac = DiracCanaries.draw(params, canaries, norm, 1.0, _generator(job, "gradient"))
    owner = torch.arange(canaries) % len(fed.clients)
    for k, client in enumerate(fed.clients):
        mine = owner == k
        own = DiracCanaries(dirac.coordinates[mine], dirac.included[mine], norm, client.q)
        client.audit = ClientAudit(own, _generator(job, "steps", k), noise_scale)
    return dirac, norm


def audit_xcal_cell(
    job: JobContext,
    setting: str,
    canaries: int,
    confidence: float = 0.95,
    noise_scale: float = 1.0,
) -> CellAudit:
    """Train the private xcal cell of `job` with `canaries` canaries of `setting` and audit it.

    The run is `dpmed.xcal.run`'s federation and rounds (`build_federation`, `train_round`;
    ROAD skipped), the canaries entering through `Client.audit` (gradient) or the clients'
    data (input).
    """
    from dpmed.config.wildcards import parse_eps
    from dpmed.xcal import run as xcal_run
    from dpmed.xcal.privacy import privacy_record

    if setting not in SETTINGS["xcal"]:
        raise ValueError(f"xcal audit setting must be one of {SETTINGS['xcal']}, got {setting!r}")
    device = job.start()
    inputs, parts = None, None
    if setting == "input":
        meta = json.loads((Path(job.processed_dir) / "meta.json").read_text())
        generator = _generator(job, "input")
        inputs = InputCanaries.draw(
            Path(job.processed_dir), canaries, int(meta["n_classes"]), generator
        )
        parts = inputs.add_to(xcal_run.client_partitions(job))
    fed = xcal_run.build_federation(job, device, parts)
    if not fed.method.dp:
        raise ValueError(f"xcal cell {job.wildcards} is not private: nothing to audit")
    if setting == "gradient":
        dirac, norm = _dirac_audits(job, fed, canaries, noise_scale)
        params = list(trainable(fed.wrapped).values())
        before = [p.detach().clone() for p in params]

        def final_scores() -> tuple[np.ndarray, np.ndarray]:
            return dirac.scores(before, params), dirac.included.numpy()

    else:
        norm = None
        for k, client in enumerate(fed.clients):
            client.audit = ClientAudit(None, _generator(job, "steps", k), noise_scale)

        def final_scores() -> tuple[np.ndarray, np.ndarray]:
            return inputs.scores(fed.net, device), inputs.included

    initial = {k: v.detach().clone() for k, v in fed.net.state_dict().items()}
    history = xcal_run.History(initial)
    for _ in range(job.params["rounds"]):
        xcal_run.train_round(fed, history, road_due=False)
    scores, included = final_scores()
    wc = dict(job.wildcards)
    record = privacy_record(fed.clients, fed.method, parse_eps(wc["eps"]), job.params)
    result = best_audit(scores, included, confidence, record.delta)
    return CellAudit(
        "xcal",
        wc["method"],
        setting,
        record.guarantee,
        float(record.epsilon),
        noise_scale,
        norm,
        wc,
        result,
    )


# ---------------------------------------------------------------------------------- entry


def audit_cell(
    study: str,
    job: JobContext,
    setting: str,
    canaries: int,
    confidence: float = 0.95,
    noise_scale: float = 1.0,
) -> CellAudit:
    """Audit one cell of `study` (`seg` or `xcal`) in `setting` and write `audit.json` into
    the job's folder; returns the audit."""
    if setting not in SETTINGS.get(study, ()):
        raise ValueError(f"no audit setting {setting!r} for study {study!r} ({SETTINGS})")
    if study == "seg":
        audit = audit_seg_cell(job, canaries, confidence, noise_scale)
    else:
        audit = audit_xcal_cell(job, setting, canaries, confidence, noise_scale)
    write_json(Path(job.out_dir) / AUDIT_FILE, audit.record())
    return audit


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m dpmed.privacy.audit.runs --config C [--config C2] RUN --setting S --canaries M
    --out DIR`: audit the grid cell whose run folder is RUN (e.g.
    results/seg/duke/unet/flat/none/eps50/seed0) with the hyperparameters, job seed and device
    the config gives its training job; writes DIR/audit.json and prints its summary."""
    import argparse

    from dpmed.config.checks import REPO, check_config, load_configs
    from dpmed.config.grid import job_seed, wildcards_from_path

    parser = argparse.ArgumentParser(prog="python -m dpmed.privacy.audit.runs")
    parser.add_argument("run", help="the cell's run folder, as its training rule names it")
    parser.add_argument("--config", action="append", default=[], help="config file(s)")
    parser.add_argument("--study", choices=sorted(SETTINGS), required=True)
    parser.add_argument("--setting", default="gradient")
    parser.add_argument("--canaries", type=int, required=True)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--noise-scale", type=float, default=1.0)
    parser.add_argument("--processed", help="processed data folder (data/processed/<dataset>)")
    parser.add_argument("--out", required=True, help="folder for audit.json")
    args = parser.parse_args(argv)
    config = load_configs(args.config)
    grid = check_config(config, REPO / "config" / "schema.yaml")
    wildcards = wildcards_from_path(args.study, args.run)
    processed = args.processed or f"data/processed/{wildcards['dataset']}"
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
