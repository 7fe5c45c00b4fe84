"""Audits of private seg cells (`dpmed.audit`): the job as `dpmed.seg.run.prepare`
builds it and the runner's epochs, with canaries added. Three settings:

- `gradient`: white-box Dirac canaries (`dpmed.privacy.audit.dirac`) entering every DP step
  through `Setup.inject`, empty Poisson batches included; score ⟨e_c, θ_0 − θ_T⟩. Their norm is
  the one the clip rule lets through largest (`canary_norm`). They extend Opacus' per-sample
  gradients: a job whose `auto` mode picks book-keeping runs with hooks (`per_sample_rows`);
  ghost clipping and an explicit book-keeping mode keep none and are refused.
- `paper-noise`: the same canaries on the run with the noise multiplier the clip rule's public
  implementation used (`ClipEntry.paper_noise`, e.g. NSGD's σ·r/C), audited against the ε the
  calibrated σ claims: what the paper code's run would claim. Only rules whose public noise
  differs from σ and is not data-dependent (NSGD) have it.
- `input`: black-box mislabelled canaries. m images the run never trains on (the val and test
  splits, drawn without replacement), canary j's mask with every pixel's class shifted by its
  own random s_j modulo the K classes (a wrong label per canary: neighbouring B-scans of one
  subject that land in the held-out splits get different wrong masks, so learning one canary
  does not teach the others), each added with probability ½ to the training split (whose size
  N, and so q = B/N, grows with them, as for any added record). Score: the final model's
  training loss (DP-Morph applied as in training) on the image's own mask minus that on the
  shifted mask.

The claimed ε is the run's `privacy_record` for the calibrated σ; `noise_scale` multiplies
the noise std actually added (the claim unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from dpmed.privacy.audit.bound import best_audit
from dpmed.privacy.audit.cell import CellAudit, audit_generator, canary_norm, require_setting
from dpmed.privacy.audit.dirac import DiracCanaries
from dpmed.privacy.clipping import CLIP_RULES
from dpmed.privacy.grad_sample_mode import resolve_grad_sample_mode
from dpmed.runtime import JobContext
from dpmed.seg import run as seg_run
from dpmed.seg.data import SegData, Split, load_seg_data
from dpmed.seg.evaluate import morph_output
from dpmed.seg.losses import per_sample_loss
from dpmed.seg.spec import SPEC

SCORE_BATCH = 64


@dataclass(frozen=True)
class SegInputCanaries:
    """m held-out images with class-shifted masks.

    Args:
        images: (m, 1, H, W) float32, as the splits hold them.
        masks: (m, H, W) int64, each its image's mask with the classes shifted.
        true_masks: (m, H, W) int64, the images' own masks (the score's difficulty reference).
        included: (m,) bool, whether the canary joins the training split.
    """

    images: torch.Tensor
    masks: torch.Tensor
    true_masks: torch.Tensor
    included: np.ndarray

    @classmethod
    def draw(cls, data: SegData, count: int, generator: torch.Generator) -> SegInputCanaries:
        """`count` images of the val and test splits, drawn without replacement; canary j's
        mask has every pixel's class shifted by its own s_j, uniform in 1..K−1, modulo the K
        classes; each included independently with probability ½ (all from `generator`)."""
        images = torch.cat([data.splits[s].images for s in ("val", "test")])
        masks = torch.cat([data.splits[s].masks for s in ("val", "test")])
        if not 0 < count <= len(masks):
            raise ValueError(f"need 0 < canaries <= {len(masks)} val + test images, got {count}")
        pick = torch.randperm(len(masks), generator=generator)[:count]
        shift = torch.randint(1, data.n_classes, (count, 1, 1), generator=generator)
        included = (torch.rand(count, generator=generator) < 0.5).numpy()
        true = masks[pick]
        return cls(images[pick], (true + shift) % data.n_classes, true, included)

    def add_to(self, data: SegData) -> SegData:
        """`data` with the included canaries appended to the training split."""
        train, keep = data.splits["train"], torch.from_numpy(self.included)
        grown = Split(
            torch.cat([train.images, self.images[keep]]),
            torch.cat([train.masks, self.masks[keep]]),
        )
        return replace(data, splits={**data.splits, "train": grown})

    def scores(self, net: torch.nn.Module, plan: seg_run.Plan, device: torch.device) -> np.ndarray:
        """Per canary, float64 (m,): the training loss (DP-Morph applied) of `net` in eval mode
        on the image's own mask minus that on its shifted mask. Subtracting the own-mask loss
        calibrates each image's difficulty (an image every model segments well scores no
        higher for it); a model that learnt the shifted mask scores high."""
        net.eval()
        dice_weight = float(plan.params["dice_weight"])
        scores = []
        with torch.no_grad():
            for start in range(0, len(self.masks), SCORE_BATCH):
                part = slice(start, start + SCORE_BATCH)
                output, _ = morph_output(plan.morph, net(self.images[part].to(device)))
                own = per_sample_loss(output, self.true_masks[part].to(device), dice_weight)
                wrong = per_sample_loss(output, self.masks[part].to(device), dice_weight)
                scores.append((own - wrong).double().cpu())
        return torch.cat(scores).numpy()


def paper_noise_multiplier(plan: seg_run.Plan, sigma: float) -> float:
    """The noise multiplier the clip rule's public implementation adds for our calibrated σ;
    ValueError for rules whose public noise is σ itself or data-dependent."""
    entry = CLIP_RULES[plan.rule.name]
    if not entry.paper_flaw or entry.paper_noise is None:
        raise ValueError(
            f"clip rule {plan.rule.name!r} has no fixed paper-code noise scale other than σ "
            "(audit setting 'gradient')"
        )
    return float(entry.paper_noise(sigma, plan.rule))


def per_sample_rows(job: JobContext) -> JobContext:
    """`job` with Opacus' per-sample gradients (`hooks`) where `auto` would pick book-keeping,
    which keeps no per-sample rows for Dirac canaries to extend; an explicit mode stays."""
    params = job.params
    mode = resolve_grad_sample_mode(params["grad_sample_mode"], job.wildcards["model"])
    if params["grad_sample_mode"] != "auto" or mode != "bk":
        return job
    return replace(job, params={**params, "grad_sample_mode": "hooks"})


def audit_cell(
    job: JobContext,
    setting: str,
    canaries: int,
    confidence: float = 0.95,
    noise_scale: float = 1.0,
) -> CellAudit:
    """Train the private seg cell of `job` with `canaries` canaries of `setting` and audit it."""
    require_setting("seg", setting, SPEC.audit_settings)
    data, inputs = None, None
    if setting == "input":
        data = load_seg_data(job.processed_dir, job.wildcards["dataset"])
        inputs = SegInputCanaries.draw(data, canaries, audit_generator(job, "input"))
        data = inputs.add_to(data)
    else:
        job = per_sample_rows(job)
    prepared = seg_run.prepare(job, data)
    plan, setup, state, device = prepared.plan, prepared.setup, prepared.state, prepared.device
    if not plan.private:
        raise ValueError(f"seg cell {job.wildcards} is not private: nothing to audit")
    if plan.mode in ("ghost", "bk") and setting != "input":
        raise ValueError(f"{plan.mode} clipping keeps no per-sample gradients for Dirac canaries")
    multiplier = setup.sigma
    if setting == "paper-noise":
        multiplier = paper_noise_multiplier(plan, setup.sigma)
    setup.dp.optimizer.noise_multiplier = multiplier * noise_scale
    params = setup.dp.optimizer.params
    norm, dirac = None, None
    if inputs is None:
        norm = canary_norm(plan.rule.factors, plan.rule.clip_norm)
        generator = audit_generator(job, "gradient")
        dirac = DiracCanaries.draw(params, canaries, norm, plan.q, generator)
        setup.inject = lambda ps: dirac.inject(ps, dirac.step_members(generator))
    before = [p.detach().clone() for p in params]
    prepared.net.train()
    for epoch in range(plan.epochs):
        seg_run.train_epoch(setup, plan, state, epoch, device)
    # the accountant recorded the σ actually used; the claim is that of the calibrated σ
    history = [(setup.sigma, q, n) for _, q, n in setup.accountant_history()]
    n_train = len(prepared.data.splits["train"])
    record = seg_run.privacy_record(plan, setup.sigma, state.empty_batches, history, n_train)
    if dirac is not None:
        scores, included = dirac.scores(before, params), dirac.included.numpy()
    else:
        scores, included = inputs.scores(prepared.net, plan, device), inputs.included
    wc = dict(job.wildcards)
    guarantee = "paper-approximation" if setting == "paper-noise" else record.guarantee
    return CellAudit(
        "seg",
        f"{wc['clip']}/{wc['morph']}",
        setting,
        guarantee,
        float(record.epsilon),
        noise_scale,
        norm,
        wc,
        best_audit(scores, included, confidence, record.delta),
    )
