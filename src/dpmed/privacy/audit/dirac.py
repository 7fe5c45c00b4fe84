"""White-box Dirac gradient canaries for DP-SGD (Steinke, Nasr & Jagielski 2023, Sec. 6: the
"Dirac canary" gradient attack; Nasr et al. 2023).

Canary j is a per-sample gradient C·e_{c_j}: norm C (the clip norm), all of it on one coordinate
c_j of the flattened trainable parameters (distinct coordinates, in parameter order). An
included canary joins each step's batch independently with the data's Poisson rate q, so it is
sampled exactly like a training example the accountant counts; the engine then scales it by
the clip rule, s(C)·C·e_{c_j}, and noises it with the batch. A canary that is not included never
joins. The score of canary j is ⟨e_{c_j}, θ_0 − θ_T⟩: a descent step moves θ against the
canaries' gradients, so included canaries tend to score high.

Two ways in, one per engine front (`dpmed.privacy.dpsgd`):

- Opacus' optimizer (seg): `inject` appends the members' rows to every parameter's per-sample
  gradients `p.grad_sample` after the backward pass, before `optimizer.step()`; the engine
  clips, sums and noises them with the batch (one tensor per parameter, so Opacus still counts
  one accumulated batch). Ghost clipping keeps no per-sample gradients and cannot take them.
- the functional step (xcal): `clipped_sums` gives Σ s(C)·C·e_{c_j} by parameter name, to add
  to `clipped_grad_sum`'s sums before `noisy_step`. Every clip factor depends on its own sample
  only, so this equals clipping the canaries inside the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch


def flat_parameters(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parameters' values concatenated in order, detached, shape (Σ numel,)."""
    return torch.cat([p.detach().reshape(-1) for p in params])


def _split(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`flat` (Σ numel,) cut into one tensor per parameter, in its shape, dtype and device."""
    out, start = [], 0
    for p in params:
        block = flat[start : start + p.numel()]
        out.append(block.reshape(p.shape).to(p.device, p.dtype))
        start += p.numel()
    return out


@dataclass(frozen=True)
class DiracCanaries:
    """m Dirac canaries over a model's trainable parameters.

    Args:
        coordinates: (m,) distinct flat indices c_j into the concatenated parameters.
        included: (m,) whether canary j is in the training run (drawn with probability ½).
        clip_norm: C, each canary gradient's norm.
        sample_rate: q, the per-step Poisson rate of an included canary.
    """

    coordinates: torch.Tensor
    included: torch.Tensor
    clip_norm: float
    sample_rate: float

    @classmethod
    def draw(
        cls,
        params: Sequence[torch.Tensor],
        count: int,
        clip_norm: float,
        sample_rate: float,
        generator: torch.Generator,
    ) -> DiracCanaries:
        """`count` canaries on distinct coordinates drawn uniformly from `params`, each
        included independently with probability ½ (both from `generator`, on the CPU)."""
        total = sum(p.numel() for p in params)
        if not 0 < count <= total:
            raise ValueError(f"need 0 < count <= {total} parameters, got {count}")
        if clip_norm <= 0 or not 0 < sample_rate <= 1:
            raise ValueError(f"need clip_norm > 0 and q in (0, 1], got {clip_norm}, {sample_rate}")
        coordinates = torch.randperm(total, generator=generator)[:count]
        included = torch.rand(count, generator=generator) < 0.5
        return cls(coordinates, included, float(clip_norm), float(sample_rate))

    @property
    def count(self) -> int:
        return len(self.coordinates)

    def step_members(self, generator: torch.Generator) -> torch.Tensor:
        """Indices of the canaries in one step's batch: included and sampled at rate q. Draws
        one uniform per canary, included or not, so the stream does not depend on inclusion."""
        sampled = torch.rand(self.count, generator=generator) < self.sample_rate
        return torch.nonzero(sampled & self.included)[:, 0]

    def grad_samples(
        self, params: Sequence[torch.Tensor], members: torch.Tensor
    ) -> list[torch.Tensor]:
        """The members' per-sample gradients C·e_{c_j}, one (k, *p.shape) tensor per parameter."""
        coordinates = self.coordinates[members]
        out, start = [], 0
        for p in params:
            rows = torch.zeros((len(members), p.numel()), dtype=p.dtype, device=p.device)
            inside = torch.nonzero((coordinates >= start) & (coordinates < start + p.numel()))[:, 0]
            rows[inside, coordinates[inside] - start] = self.clip_norm
            out.append(rows.reshape(len(members), *p.shape))
            start += p.numel()
        return out

    def inject(self, params: Sequence[torch.Tensor], members: torch.Tensor) -> None:
        """Append the members' rows to every parameter's `grad_sample` (Opacus' optimizer
        front, after the backward pass, before `optimizer.step()`). A list-form `grad_sample`
        (Opacus' accumulation over several backward passes) gets them in its last batch, so
        Opacus still counts as many accumulated batches."""
        for p, rows in zip(params, self.grad_samples(params, members), strict=True):
            current = getattr(p, "grad_sample", None)
            if current is None:
                raise ValueError("no per-sample gradients to extend (ghost mode or no backward)")
            if isinstance(current, list):
                p.grad_sample = [*current[:-1], torch.cat([current[-1], rows])]
            else:
                p.grad_sample = torch.cat([current, rows])

    def clipped_sums(
        self,
        params: Mapping[str, torch.Tensor],
        members: torch.Tensor,
        factors: Callable[[torch.Tensor], torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """Σ_j s(C)·C·e_{c_j} over the members, by parameter name (the functional front).

        Args:
            params: the trainable parameters by name, in the order the coordinates index.
            members: `step_members`' indices.
            factors: the step's clip factors, norms (k,) → s (k,), as given to `clipped_grad_sum`.
        """
        norms = torch.full((len(members),), self.clip_norm, dtype=torch.float64)
        values = factors(norms).to(torch.float64) * self.clip_norm
        total = sum(p.numel() for p in params.values())
        flat = torch.zeros(total, dtype=torch.float64)
        flat.index_add_(0, self.coordinates[members], values)
        return dict(zip(params, _split(flat, list(params.values())), strict=True))

    def scores(self, before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> np.ndarray:
        """⟨e_{c_j}, θ_0 − θ_T⟩ per canary, float64 (m,): `before` and `after` are the
        parameters at the start and the end of training, in the coordinates' order."""
        delta = flat_parameters(before).double() - flat_parameters(after).double()
        return delta[self.coordinates].cpu().numpy()
