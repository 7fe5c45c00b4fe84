"""The DP-SGD engine of the seg and xcal studies, on Opacus' per-sample gradients.

One core, `per_sample_norms` → per-sample factors s_i → `scaled_sum` Σ_i s_i·g_i → Gaussian
noise N(0, (σ·C)²) per coordinate → division by the expected batch size q·N, with two fronts:

- Opacus' optimizer (seg): `ScaledPrivacyEngine.make_private_poisson` builds a
  `ScaledDPOptimizer` (hooks/functorch), a `ScaledGhostModule` (ghost) or a
  `BookkeepingModule` (bk: one backward pass, `dpmed.privacy.bookkeeping`) whose factors are a
  clip rule's (`dpmed.privacy.clipping`), with a Poisson loader and one accountant step per
  batch. Ghost and bk leave Σ_i s_i·g_i in p.grad; Opacus' fast-gradient-clipping optimizer
  then adds the same noise and divides by the same q·N as the other modes.
  It also records `last_alignment`, the cosine between a = Σ_i s_i·g_i and the mean gradient
  (paper 002 Fig. 7), summed parameter by parameter in float64.
- a functional step (xcal): `clipped_grad_sum` then `noisy_step` on a `wrap_per_sample`
  module (hooks, functorch or bk); its noise std may differ per output channel (AGP), which
  Opacus' optimizer cannot express, and it draws the noise from the caller's generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from opacus import GradSampleModule, PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch import nn
from torch.utils.data import Dataset

from dpmed.privacy.bookkeeping import BookkeepingModule
from dpmed.privacy.clipping import ClipRule


def per_sample_norms(grad_samples: Sequence[torch.Tensor]) -> torch.Tensor:
    """‖g_i‖₂ over all parameters, from Opacus' per-parameter per-sample gradients.

    Args:
        grad_samples: one (B, ...) tensor per parameter (B > 0).
    """
    per_param = [g.reshape(len(g), -1).norm(2, dim=-1) for g in grad_samples]
    return torch.stack(per_param, dim=1).norm(2, dim=1)


def scaled_sum(factors: torch.Tensor, grad_sample: torch.Tensor) -> torch.Tensor:
    """Σ_i s_i·g_i of one parameter's per-sample gradients.

    Args:
        factors: s_i, shape (B,); cast to the gradients' device and dtype.
        grad_sample: g_i, shape (B, *parameter shape).
    """
    return torch.einsum("i,i...", factors.to(grad_sample.device, grad_sample.dtype), grad_sample)


def opacus_clip_factors(norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Opacus' own flat clipping factor min(1, C/(‖g_i‖ + 1e-6)) (xcal's clipping).

    The seg `flat` rule (`ClipRule("flat")`) computes min(1, C/‖g_i‖) without the 1e-6; the
    two differ in the last bits, so each study keeps its own.
    """
    return (clip_norm / (norms + 1e-6)).clamp(max=1.0)


@dataclass(frozen=True)
class StepAlignment:
    """One DP step: its batch size B, the share of samples with factor s(n_i) < 1 and cos(a, b)
    (NaN when a or b is zero)."""

    batch_size: int
    clipped_fraction: float
    cosine: float


class CosineSums:
    """⟨a,b⟩, ‖a‖², ‖b‖² of two vectors given block by block (one parameter at a time), summed in
    float64 on the blocks' device; `cosine()` reads them once. Equal blocks give exactly 1."""

    def __init__(self) -> None:
        self._sums: torch.Tensor | None = None

    def add(self, a: torch.Tensor, b: torch.Tensor) -> None:
        a, b = a.detach().reshape(-1).double(), b.detach().reshape(-1).double()
        block = torch.stack([torch.dot(a, b), torch.dot(a, a), torch.dot(b, b)])
        self._sums = block if self._sums is None else self._sums + block

    def cosine(self) -> float:
        if self._sums is None:
            return math.nan
        dot, aa, bb = self._sums.tolist()
        norms = math.sqrt(aa * bb)  # not sqrt(aa)·sqrt(bb): sqrt(x·x) == x exactly
        return dot / norms if norms > 0 else math.nan


def step_alignment(factors: torch.Tensor, sums: CosineSums) -> StepAlignment:
    """The StepAlignment of a step with per-sample factors `factors` (shape [B], B > 0)."""
    return StepAlignment(len(factors), float((factors < 1).double().mean()), sums.cosine())


class ScaledDPOptimizer(DPOptimizer):
    """DPOptimizer whose clipping is `rule.factors` (max_grad_norm = rule.clip_norm)."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, rule: ClipRule, **kwargs) -> None:
        if not rule.bounded:
            raise ValueError("DP-SGD needs a bounded clipping rule (not 'none')")
        kwargs["max_grad_norm"] = rule.clip_norm
        super().__init__(optimizer, **kwargs)
        self.rule = rule
        self.last_norms: torch.Tensor | None = None
        self.last_alignment: StepAlignment | None = None

    def clip_and_accumulate(self) -> None:
        """p.summed_grad += Σ_i s(n_i)·g_i (per-sample scaling by the rule, no hard clip); sets
        `last_alignment` (None for an empty batch). b is accumulated as Σ_i g_i = B·b (the cosine
        is scale-free) with the same einsum as a, so s ≡ 1 gives a == b bit for bit."""
        samples = self.grad_samples
        if len(samples[0]) == 0:
            factors = torch.zeros((0,), device=samples[0].device)
            self.last_norms = factors
        else:
            norms = per_sample_norms(samples)
            self.last_norms = norms.detach()
            factors = self.rule.factors(norms)
        sums = CosineSums()
        for p in self.params:
            _check_processed_flag(p.grad_sample)
            grad_sample = self._get_flat_grad_sample(p).to(p.dtype)
            grad = scaled_sum(factors, grad_sample)
            sums.add(grad, scaled_sum(torch.ones_like(factors), grad_sample))
            p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
            _mark_as_processed(p.grad_sample)
        self.last_alignment = step_alignment(factors, sums) if len(factors) else None


class ScaledGhostOptimizer(DPOptimizerFastGradientClipping):
    """Opacus' fast-gradient-clipping optimizer; `last_alignment` is set by `DPSGD.backward`,
    the only place where the mean and the scaled gradient both exist in ghost mode."""

    def __init__(self, optimizer: torch.optim.Optimizer, **kwargs) -> None:
        super().__init__(optimizer, **kwargs)
        self.last_alignment: StepAlignment | None = None


class ScaledGhostModule(GradSampleModuleFastGradientClipping):
    """Ghost/fast-gradient-clipping module whose clipping coefficient is `rule.factors`."""

    def __init__(self, m: nn.Module, *, rule: ClipRule, **kwargs) -> None:
        kwargs["max_grad_norm"] = rule.clip_norm
        super().__init__(m, **kwargs)
        self.rule = rule

    def get_clipping_coef(self) -> torch.Tensor:
        return self.rule.factors(self.get_norm_sample())


class ScaledPrivacyEngine(PrivacyEngine):
    """PrivacyEngine building the rule-aware module/optimizer for any grad-sample mode."""

    def __init__(self, rule: ClipRule, accountant: str = "rdp") -> None:
        super().__init__(accountant=accountant)
        if not rule.bounded:
            raise ValueError("DP-SGD needs a bounded clipping rule (not 'none')")
        self.rule = rule

    def _prepare_model(self, module: nn.Module, *, grad_sample_mode: str = "hooks", **kwargs):
        if grad_sample_mode == "bk":
            return BookkeepingModule(module)
        if grad_sample_mode == "ghost":
            self.validate(module=module, optimizer=None, data_loader=None)
            return ScaledGhostModule(
                module,
                rule=self.rule,
                batch_first=kwargs.get("batch_first", True),
                loss_reduction=kwargs.get("loss_reduction", "mean"),
            )
        return super()._prepare_model(module, grad_sample_mode=grad_sample_mode, **kwargs)

    def _prepare_optimizer(
        self,
        *,
        optimizer: torch.optim.Optimizer,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: int,
        loss_reduction: str = "mean",
        grad_sample_mode: str = "hooks",
        **kwargs,
    ) -> ScaledDPOptimizer | ScaledGhostOptimizer:
        if max_grad_norm != self.rule.clip_norm:
            raise ValueError("max_grad_norm must equal the rule's clip_norm (noise std σ·C)")
        common = dict(
            noise_multiplier=noise_multiplier,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            generator=kwargs.get("noise_generator"),
            secure_mode=self.secure_mode,
        )
        if isinstance(optimizer, DPOptimizer):
            optimizer = optimizer.original_optimizer
        if grad_sample_mode in ("ghost", "bk"):  # both leave the clipped sum in p.grad
            return ScaledGhostOptimizer(optimizer, max_grad_norm=self.rule.clip_norm, **common)
        return ScaledDPOptimizer(optimizer, rule=self.rule, **common)

    def make_private_poisson(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: Dataset,
        *,
        sample_rate: float,
        noise_multiplier: float,
        grad_sample_mode: str,
        generator: torch.Generator | None = None,
    ) -> DPSGD:
        """Wrap `module`/`optimizer` for DP-SGD over `dataset` with Poisson rate `sample_rate`.

        The loader yields int(1/q) batches per epoch; the accountant records (σ, q) at every
        optimizer step.
        """
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        dp_module = self._prepare_model(
            module, grad_sample_mode=grad_sample_mode, max_grad_norm=self.rule.clip_norm
        )
        expected = sample_rate * len(dataset)
        dp_optimizer = self._prepare_optimizer(
            optimizer=optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=self.rule.clip_norm,
            expected_batch_size=expected,
            grad_sample_mode=grad_sample_mode,
        )
        dp_optimizer.attach_step_hook(
            self.accountant.get_optimizer_hook_fn(sample_rate=sample_rate)
        )
        loader = DPDataLoader(dataset, sample_rate=sample_rate, generator=generator)
        return DPSGD(dp_module, dp_optimizer, loader, grad_sample_mode, self)


@dataclass
class DPSGD:
    """A DP-SGD training setup: wrapped module, DP optimizer, Poisson loader, engine."""

    module: nn.Module
    optimizer: ScaledDPOptimizer | ScaledGhostOptimizer
    loader: DPDataLoader
    mode: str
    engine: ScaledPrivacyEngine

    def backward(self, loss_per_sample: torch.Tensor) -> None:
        """Backpropagate a per-sample loss of shape [B] (the batch loss is its mean)."""
        _check_per_sample(loss_per_sample)
        if self.mode == "ghost":
            self._ghost_backward(loss_per_sample)
        elif self.mode == "bk":
            self._bk_backward([loss_per_sample])
        else:
            loss_per_sample.mean().backward()

    def backward_chunks(self, chunk_losses: Iterable[torch.Tensor]) -> None:
        """Backpropagate one Poisson batch given as physical chunks (memory, not privacy: the
        batch is still one sampled batch and one accounted step).

        `chunk_losses` yields each chunk's per-sample loss [B_c] right after that chunk's
        forward pass, so only one chunk's activations are alive at a time. p.grad becomes
        Σ_c Σ_{i∈c} s(n_i)·∇loss_i, the whole batch's clipped sum (each factor depends on its
        own sample only), and the alignment is taken over the whole batch. Book-keeping mode
        only: Opacus' hooks refuse gradient accumulation under Poisson sampling, and ghost
        clipping's two passes would need every chunk's graph at once.
        """
        if self.mode != "bk":
            raise ValueError(
                f"physical chunks need grad_sample_mode bk (the job resolved {self.mode!r})"
            )
        self._bk_backward(chunk_losses)

    def _ghost_backward(self, loss_per_sample: torch.Tensor) -> None:
        """Opacus' two passes (`DPTensorFastGradientClipping.backward`): the first, with the
        norm hooks on, leaves the plain mean gradient b in p.grad, kept for the alignment; the
        second, hooks off, sums s(n_i)·∇loss_i into p.grad."""
        loss_per_sample.mean().backward(retain_graph=True)
        params = self.optimizer.params
        mean_grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
        self.optimizer.zero_grad()
        factors = self.module.get_clipping_coef()
        self.module.disable_hooks()
        (factors.to(loss_per_sample.device) * loss_per_sample).sum().backward()
        self.module.enable_hooks()
        sums = CosineSums()
        for p, b in zip(params, mean_grads, strict=True):
            if b is not None and p.grad is not None:
                sums.add(p.grad, b)
        self.optimizer.last_alignment = step_alignment(factors, sums)

    def _bk_backward(self, chunk_losses: Iterable[torch.Tensor]) -> None:
        """One book-keeping pass per chunk (`dpmed.privacy.bookkeeping`): p.grad = Σ_i
        s(n_i)·∇loss_i over every chunk, and the alignment against Σ_i ∇loss_i (the seg runner
        records it at every step). One chunk sets p.grad to its pass's sums unchanged."""
        clipped: dict[str, torch.Tensor] = {}
        unclipped: dict[str, torch.Tensor] = {}
        factors = []
        for loss_per_sample in chunk_losses:
            _check_per_sample(loss_per_sample)
            result = self.module.clipped_sum(
                loss_per_sample, self.engine.rule.factors, alignment=True
            )
            factors.append(result.factors)
            for name, grad in result.sums.items():
                clipped[name] = grad + clipped[name] if name in clipped else grad
                raw = result.unclipped[name]
                unclipped[name] = raw + unclipped[name] if name in unclipped else raw
            del result, loss_per_sample  # this chunk's graph is gone before the next forward
        sums = CosineSums()
        for name, p in self.module.named.items():
            if p.requires_grad:
                p.grad = clipped[name]
                sums.add(p.grad, unclipped[name])
        self.optimizer.last_alignment = step_alignment(torch.cat(factors), sums)

    def step_empty(self, inject: Callable[[list[nn.Parameter]], None] | None = None) -> None:
        """An optimizer step for an empty Poisson batch: noise only, still one accounted step.

        `inject`, when given, gets the parameters after their zero-row per-sample gradients are
        set and before the step, so extra per-sample rows (audit canaries) still enter it.
        """
        self.optimizer.last_alignment = None
        for p in self.optimizer.params:
            if self.mode in ("ghost", "bk"):
                p.grad = torch.zeros_like(p)
            else:
                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        if inject is not None:
            inject(self.optimizer.params)
        self.optimizer.step()


def _check_per_sample(loss_per_sample: torch.Tensor) -> None:
    if loss_per_sample.dim() != 1:
        raise ValueError(f"expected a per-sample loss of shape [B], got {loss_per_sample.shape}")


# ------------------------------------------------------------------ functional step (xcal)


def wrap_per_sample(model: nn.Module, mode: str) -> GradSampleModule | BookkeepingModule:
    """The per-sample-gradient wrapper for a summed loss.

    Args:
        model: the network.
        mode: "hooks" (Opacus layer hooks), "functorch" (Opacus' vmap) or "bk" (one-backward
            book-keeping, `dpmed.privacy.bookkeeping`).
    """
    if mode == "bk":
        return BookkeepingModule(model)
    if mode not in ("hooks", "functorch"):
        raise ValueError(f"grad-sample mode must be hooks, functorch or bk, got {mode!r}")
    return GradSampleModule(model, loss_reduction="sum", force_functorch=mode == "functorch")


def trainable(module: nn.Module) -> dict[str, nn.Parameter]:
    """Named trainable parameters (names without the wrapper's `_module.` prefix)."""
    return {
        name.removeprefix("_module."): p for name, p in module.named_parameters() if p.requires_grad
    }


def clipped_grad_sum(
    gsm: GradSampleModule | BookkeepingModule,
    x: torch.Tensor,
    y: torch.Tensor,
    factors: Callable[[torch.Tensor], torch.Tensor],
    loss: Callable[..., torch.Tensor] = F.cross_entropy,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Σ_i s(‖g_i‖)·g_i per parameter and the per-sample norms ‖g_i‖ (B,) before scaling.

    An empty batch gives zero sums (the noisy step still happens, as Poisson sampling
    requires). The wrapper's `grad_sample` and `.grad` are cleared afterwards.

    Args:
        gsm: the model wrapped by `wrap_per_sample`.
        x, y: the batch (B ≥ 0).
        factors: per-sample norms (B,) → scale factors (B,), e.g. a clip rule's `factors` or
            `opacus_clip_factors` with its clip norm.
        loss: `loss(logits, y, reduction="sum")`, the summed per-sample loss
            (`reduction="none"`, the per-sample losses, for a `BookkeepingModule`).
    """
    params = trainable(gsm)
    if x.shape[0] == 0:
        zeros = {name: torch.zeros_like(p) for name, p in params.items()}
        return zeros, torch.zeros(0, device=x.device)
    gsm.train()
    if isinstance(gsm, BookkeepingModule):
        result = gsm.clipped_sum(loss(gsm(x), y, reduction="none"), factors)
        return result.sums, result.norms
    loss(gsm(x), y, reduction="sum").backward()
    samples = {name: p.grad_sample for name, p in params.items()}
    norms = per_sample_norms(list(samples.values()))
    scale = factors(norms)
    sums = {name: scaled_sum(scale, g) for name, g in samples.items()}
    zero_grad_samples(gsm)
    return sums, norms


def zero_grad_samples(gsm: GradSampleModule) -> None:
    """Drop `.grad_sample` and `.grad` of every parameter (Opacus accumulates them)."""
    for p in gsm.parameters():
        p.grad_sample = None
        p.grad = None


def noisy_step(
    gsm: GradSampleModule,
    optimizer: torch.optim.Optimizer,
    sums: Mapping[str, torch.Tensor],
    noise_std: Mapping[str, torch.Tensor | float],
    expected_batch: float,
    generator: torch.Generator,
) -> None:
    """Set `.grad = (sum + N(0, std²)) / expected_batch` for every parameter, then step.

    Args:
        gsm: the wrapped model.
        optimizer: its optimizer.
        sums: `clipped_grad_sum`'s sums by parameter name.
        noise_std: std by parameter name: a float, or a (C0,) tensor broadcast along dim 0
            (one std per output channel; the guarantee is that of the smallest).
        expected_batch: q·N, Opacus' divisor under Poisson sampling.
        generator: the noise generator (one draw per parameter, in parameter order).
    """
    for name, p in trainable(gsm).items():
        std = noise_std[name]
        noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
        if isinstance(std, torch.Tensor):
            noise = noise * std.reshape(-1, *([1] * (p.dim() - 1)))
        else:
            noise = noise * float(std)
        p.grad = (sums[name] + noise) / expected_batch
    optimizer.step()
    zero_grad_samples(gsm)
