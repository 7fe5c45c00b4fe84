"""Audits of private xcal cells (`dpmed.audit`): the federation as
`dpmed.xcal.federation.prepare` builds it and the runner's rounds, with canaries entering each
client's DP step through `Client.audit` (`gradient`: Dirac canaries, canary j belonging to
client j mod K and sampled at that client's q; XCal-FL's signal step does not see them, a
record whose signal is 0, a value it may take) or the clients' data (`input`: held-out images
with a wrong label, added to client j mod K, whose size and so q grow with them; score −CE of
the final global model on the wrong label). ROAD is skipped."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpmed.config.wildcards import parse_eps
from dpmed.privacy.audit.bound import best_audit
from dpmed.privacy.audit.cell import CellAudit, audit_generator, canary_norm, require_setting
from dpmed.privacy.audit.dirac import DiracCanaries
from dpmed.privacy.dpsgd import opacus_clip_factors, trainable
from dpmed.runtime import JobContext
from dpmed.xcal import federation as xcal_fed
from dpmed.xcal.privacy import privacy_record
from dpmed.xcal.spec import SPEC

SCORE_BATCH = 256


@dataclass
class ClientAudit:
    """A privacy audit's hook into a client's DP step (`Client.audit`): its Dirac canaries
    (None: none), sampled at its rate q from `generator`, and the factor on the noise std."""

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
        splits = [xcal_fed.load_split(processed_dir, split) for split in ("val", "test")]
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
        net.eval()
        losses = []
        with torch.no_grad():
            for start in range(0, len(self.labels), SCORE_BATCH):
                x = xcal_fed.to_tensor(self.images[start : start + SCORE_BATCH], device)
                y = torch.from_numpy(self.labels[start : start + SCORE_BATCH]).to(device)
                losses.append(F.cross_entropy(net(x), y, reduction="none").double().cpu())
        return -torch.cat(losses).numpy()


def audit_cell(
    job: JobContext,
    setting: str,
    canaries: int,
    confidence: float = 0.95,
    noise_scale: float = 1.0,
) -> CellAudit:
    """Train the private xcal cell of `job` with `canaries` canaries of `setting` and audit it.

    The run is `dpmed.xcal.federation`'s federation and rounds (`prepare`, `train_round`; ROAD
    skipped), the canaries entering through `Client.audit` (gradient) or the clients' data
    (input).
    """
    require_setting("xcal", setting, SPEC.audit_settings)
    inputs, parts = None, None
    if setting == "input":
        meta = json.loads((Path(job.processed_dir) / "meta.json").read_text())
        generator = audit_generator(job, "input")
        inputs = InputCanaries.draw(
            Path(job.processed_dir), canaries, int(meta["n_classes"]), generator
        )
        parts = inputs.add_to(xcal_fed.client_partitions(job))
    device, fed = xcal_fed.prepare(job, parts)
    if not fed.method.dp:
        raise ValueError(f"xcal cell {job.wildcards} is not private: nothing to audit")
    if setting == "gradient":
        # the cell's Dirac canaries over the global model, canary j → client j mod K, sampled at
        # that client's q (drawn at q = 1: only their coordinates and inclusions are used)
        params = list(trainable(fed.wrapped).values())
        clip_norm = float(job.params["clip_norm"])
        norm = canary_norm(lambda n: opacus_clip_factors(n, clip_norm), clip_norm)
        dirac = DiracCanaries.draw(params, canaries, norm, 1.0, audit_generator(job, "gradient"))
        owner = torch.arange(canaries) % len(fed.clients)
        for k, client in enumerate(fed.clients):
            mine, q = owner == k, client.account.q
            own = DiracCanaries(dirac.coordinates[mine], dirac.included[mine], norm, q)
            client.audit = ClientAudit(own, audit_generator(job, "steps", k), noise_scale)
        before = [p.detach().clone() for p in params]

        def final_scores() -> tuple[np.ndarray, np.ndarray]:
            return dirac.scores(before, params), dirac.included.numpy()

    else:
        norm = None
        for k, client in enumerate(fed.clients):
            client.audit = ClientAudit(None, audit_generator(job, "steps", k), noise_scale)

        def final_scores() -> tuple[np.ndarray, np.ndarray]:
            return inputs.scores(fed.net, device), inputs.included

    state = xcal_fed.TrainState.start(fed.net)
    for _ in range(job.params["rounds"]):
        xcal_fed.train_round(fed, state, road_due=False)
    scores, included = final_scores()
    wc = dict(job.wildcards)
    record = privacy_record(fed.accounts, fed.method, parse_eps(wc["eps"]), job.params)
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
