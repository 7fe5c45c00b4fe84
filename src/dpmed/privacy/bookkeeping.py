"""Book-keeping DP-SGD: the clipped sum Σ_i s(‖g_i‖)·g_i from one backward pass.

The technique of Bu et al. (2023, "fastDP", book-keeping with mixed ghost clipping): the
backward pass computes only the gradients of the loss with respect to each parametrised layer's
output (`torch.autograd.grad` on the layers' outputs, so autograd never forms the ordinary
weight gradient), while forward hooks keep every layer's input. For a layer with input a_i
(T positions × d features per sample) and output gradient g_i (T × p), the per-sample weight
gradient is a_iᵀg_i. Per layer, its squared norm comes from whichever is cheaper:

- ghost norm, ‖a_iᵀg_i‖² = ⟨a_i a_iᵀ, g_i g_iᵀ⟩ (two T×T Gram matrices, cost ~B·T²·(d+p));
- instantiation of a_iᵀg_i (cost ~B·T·d·p), convolutions through one grouped weight-gradient
  convolution with the batch folded into the groups.

The per-sample norms n_i = ‖g_i‖ over all parameters give the factors s_i = s(n_i) of any clip
rule (`dpmed.privacy.clipping`), and the clipped sum is formed directly: Σ_i s_i·a_iᵀg_i =
aᵀ(s⊙g) for ghost-norm layers (one weight-gradient computation on reweighted output
gradients), Σ_i s_i·G_i for instantiated ones. The unclipped batch gradient is never formed
unless asked for (`alignment=True`, for paper 002's Fig. 7 cosine).

Supported layers: Linear, Conv1d/2d/3d, ConvTranspose1d/2d/3d (any groups, zero padding or a
padding mode), GroupNorm (affine). A module with trainable parameters of another type raises
`UnsupportedLayerError` naming it. Each supported module may run once per forward pass (no
shared modules) and its output must not be modified in place afterwards (Opacus' rules too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.conv import _ConvNd, _ConvTransposeNd

SUPPORTED = (nn.Linear, _ConvNd, nn.GroupNorm)
GHOST_CHOICES = ("auto", "always", "never")
GRAM_LIMIT = 2**26  # largest B·T² Gram-matrix element count a ghost norm may allocate


class UnsupportedLayerError(TypeError):
    """A parametrised module the book-keeping engine has no per-sample rule for."""


@dataclass
class _Call:
    """One recorded forward call: the layer's input (detached) and output, and their version
    counters (an in-place change of either after the hook would make the gradients wrong)."""

    name: str
    module: nn.Module
    inputs: torch.Tensor
    output: torch.Tensor
    versions: tuple[int, int]


@dataclass
class _LayerGrads:
    """One layer's per-sample squared norms (B,), its instantiated per-sample gradients
    (parameter name → (B, *shape)) and, for ghost-norm parameters, a function s → Σ_i s_i·g_i."""

    sq_norms: torch.Tensor
    instantiated: dict[str, torch.Tensor] = field(default_factory=dict)
    ghost: dict[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClippedSum:
    """The result of one book-keeping backward pass.

    Args:
        sums: Σ_i s_i·g_i by parameter name (names as in the wrapped module).
        norms: n_i = ‖g_i‖₂ over all trainable parameters, shape (B,).
        factors: s_i = s(n_i), shape (B,).
        unclipped: Σ_i g_i by parameter name when asked for (alignment), else None.
        ghost: names of the layers whose norms were computed by the ghost-norm trick.
    """

    sums: dict[str, torch.Tensor]
    norms: torch.Tensor
    factors: torch.Tensor
    unclipped: dict[str, torch.Tensor] | None
    ghost: tuple[str, ...]


class BookkeepingModule(nn.Module):
    """Wraps a network for book-keeping per-sample clipping (state-dict keys gain `_module.`,
    as with Opacus' wrappers).

    Args:
        module: the network; every submodule with trainable parameters must be supported.
        ghost: per-layer norm method: "auto" (cheaper by the cost model, the module
            docstring), "always" (ghost norm wherever implemented: Linear, ungrouped Conv2d)
            or "never" (instantiate everywhere). The choice depends on shapes only, never on
            timings, so identical inputs give identical results.
    """

    def __init__(self, module: nn.Module, ghost: str = "auto") -> None:
        super().__init__()
        if ghost not in GHOST_CHOICES:
            raise ValueError(f"ghost must be one of {GHOST_CHOICES}, got {ghost!r}")
        self._module = module
        self.ghost = ghost
        self.named = dict(module.named_parameters())  # the Parameter objects survive .to()
        self._calls: list[_Call] = []
        self._active = False
        self._layers: dict[nn.Module, str] = {}
        for name, sub in module.named_modules():
            if isinstance(sub, nn.modules.batchnorm._BatchNorm):
                raise UnsupportedLayerError(
                    f"module '{name}' ({type(sub).__name__}) mixes the samples of a batch"
                )
            own = [p for p in sub.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            if not isinstance(sub, SUPPORTED):
                raise UnsupportedLayerError(
                    f"book-keeping DP-SGD has no per-sample rule for module '{name}' "
                    f"({type(sub).__name__}); supported: Linear, Conv*d, ConvTranspose*d, "
                    "GroupNorm"
                )
            if isinstance(sub, nn.GroupNorm) and not sub.affine:
                continue
            self._layers[sub] = name
            sub.register_forward_hook(self._record)

    def forward(self, *args, **kwargs):
        self._calls, self._active = [], True
        try:
            return self._module(*args, **kwargs)
        finally:
            self._active = False

    def _record(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if not (self._active and self.training and torch.is_grad_enabled()):
            return  # a call of the bare network, in eval mode or without autograd
        name = self._layers[module]
        if len(inputs) != 1:
            raise UnsupportedLayerError(f"module '{name}' called with extra arguments")
        if any(call.module is module for call in self._calls):
            raise UnsupportedLayerError(f"module '{name}' runs twice in one forward pass")
        versions = (inputs[0]._version, output._version)
        self._calls.append(_Call(name, module, inputs[0].detach(), output, versions))

    def clipped_sum(
        self,
        loss_per_sample: torch.Tensor,
        factors: Callable[[torch.Tensor], torch.Tensor],
        *,
        alignment: bool = False,
    ) -> ClippedSum:
        """Backpropagate Σ_i loss_i once and return Σ_i s(n_i)·∇loss_i per parameter.

        Args:
            loss_per_sample: loss_i of the last forward pass, shape (B,), B ≥ 1; loss_i must
                depend on sample i only (true for every supported layer).
            factors: norms (B,) → factors (B,), e.g. a clip rule's `factors`.
            alignment: also return Σ_i g_i (one more weight-gradient computation for
                ghost-norm layers).
        """
        calls, self._calls = self._calls, []
        batch = len(loss_per_sample)
        for call in calls:
            if (call.inputs._version, call.output._version) != call.versions:
                raise RuntimeError(
                    f"the input or output of module '{call.name}' was modified in place"
                )
        grads = torch.autograd.grad(
            loss_per_sample.sum(), [c.output for c in calls], allow_unused=True
        )
        layers, ghost_names = [], []
        for call, g in zip(calls, grads, strict=True):
            if g is None:
                g = torch.zeros_like(call.output)
            layer = _layer_grads(call, g, self.ghost)
            if layer.ghost:
                ghost_names.append(call.name)
            layers.append((call.name, layer))
        params = self.named
        dtype = next(iter(params.values())).dtype
        sq = torch.zeros(batch, dtype=dtype, device=loss_per_sample.device)
        for _, layer in layers:
            sq = sq + layer.sq_norms
        norms = sq.sqrt()
        scale = factors(norms).to(dtype)
        sums = _weighted(layers, scale, params)
        unclipped = _weighted(layers, torch.ones_like(scale), params) if alignment else None
        return ClippedSum(sums, norms.detach(), scale.detach(), unclipped, tuple(ghost_names))


def _weighted(
    layers: list[tuple[str, _LayerGrads]], scale: torch.Tensor, params: dict[str, nn.Parameter]
) -> dict[str, torch.Tensor]:
    """Σ_i scale_i·g_i for every trainable parameter (zeros for those no call reached)."""
    found = {}
    for prefix, layer in layers:
        for local, grad_sample in layer.instantiated.items():
            found[_join(prefix, local)] = torch.einsum("i,i...->...", scale, grad_sample)
        for local, weighted in layer.ghost.items():
            found[_join(prefix, local)] = weighted(scale)
    return {
        name: found[name] if name in found else torch.zeros_like(p)
        for name, p in params.items()
        if p.requires_grad
    }


def _join(prefix: str, local: str) -> str:
    return f"{prefix}.{local}" if prefix else local


def _trainable(module: nn.Module, name: str) -> bool:
    p = getattr(module, name, None)
    return p is not None and p.requires_grad


def _use_ghost(mode: str, batch: int, positions: int, d: int, p: int) -> bool:
    """Ghost norm when it is cheaper: B·T²·(d+p) < B·T·d·p, and the Gram matrices fit."""
    if mode == "never" or batch * positions * positions > GRAM_LIMIT:
        return False
    return mode == "always" or positions * (d + p) < d * p


def _layer_grads(call: _Call, g: torch.Tensor, mode: str) -> _LayerGrads:
    m = call.module
    if isinstance(m, nn.Linear):
        return _linear(m, call.inputs, g, mode)
    if isinstance(m, nn.GroupNorm):
        return _group_norm(m, call.inputs, g)
    return _conv(m, call.inputs, g, mode)


def _bias_rows(m: nn.Module, g: torch.Tensor, channel_last: bool) -> dict[str, torch.Tensor]:
    """Per-sample bias gradients (B, p): g summed over every position."""
    if not _trainable(m, "bias"):
        return {}
    if channel_last:
        return {"bias": g.reshape(len(g), -1, g.shape[-1]).sum(1)}
    return {"bias": g.reshape(len(g), g.shape[1], -1).sum(-1)}


def _row_squares(t: torch.Tensor) -> torch.Tensor:
    """‖t_i‖² per sample (B,), without a squared copy of t."""
    return torch.linalg.vector_norm(t.reshape(len(t), -1), dim=1).square()


def _squares(instantiated: dict[str, torch.Tensor], batch: int, like: torch.Tensor):
    sq = torch.zeros(batch, dtype=like.dtype, device=like.device)
    for grad_sample in instantiated.values():
        sq = sq + _row_squares(grad_sample)
    return sq


def _linear(m: nn.Linear, a: torch.Tensor, g: torch.Tensor, mode: str) -> _LayerGrads:
    """Linear on (B, ..., d) inputs: T = the positions between batch and features."""
    batch = len(a)
    a3, g3 = a.reshape(batch, -1, a.shape[-1]), g.reshape(batch, -1, g.shape[-1])
    positions, d, p = a3.shape[1], a3.shape[2], g3.shape[2]
    instantiated = _bias_rows(m, g, channel_last=True)
    layer = _LayerGrads(_squares(instantiated, batch, g), instantiated)
    if not _trainable(m, "weight"):
        return layer
    if _use_ghost(mode, batch, positions, d, p):
        if positions == 1:
            sq = _row_squares(a3) * _row_squares(g3)
        else:
            sq = (a3 @ a3.transpose(1, 2) * (g3 @ g3.transpose(1, 2))).sum((1, 2))
        layer.sq_norms = layer.sq_norms + sq
        layer.ghost["weight"] = lambda s: torch.einsum("btp,btd->pd", g3 * s[:, None, None], a3)
    else:
        grad_sample = torch.einsum("btp,btd->bpd", g3, a3)
        layer.instantiated["weight"] = grad_sample
        layer.sq_norms = layer.sq_norms + _row_squares(grad_sample)
    return layer


def _group_norm(m: nn.GroupNorm, a: torch.Tensor, g: torch.Tensor) -> _LayerGrads:
    """GroupNorm y = x̂·w + b: per-sample ∂w = Σ_positions g⊙x̂, ∂b = Σ_positions g."""
    batch = len(a)
    instantiated = _bias_rows(m, g, channel_last=False)
    if _trainable(m, "weight"):
        normalised = F.group_norm(a, m.num_groups, None, None, m.eps)
        instantiated["weight"] = (g * normalised).reshape(batch, m.num_channels, -1).sum(-1)
    return _LayerGrads(_squares(instantiated, batch, g), instantiated)


def _conv_geometry(m: _ConvNd, a: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The (padded) input and the arguments of `aten.convolution_backward` for `m`."""
    dims = a.dim() - 2
    transposed = isinstance(m, _ConvTransposeNd)
    padding = m.padding
    if isinstance(padding, str):
        if padding != "valid":
            raise UnsupportedLayerError(f"conv padding '{padding}' is not supported")
        padding = (0,) * dims
    if m.padding_mode != "zeros":
        a = F.pad(a, m._reversed_padding_repeated_twice, mode=m.padding_mode)
        padding = (0,) * dims
    geometry = dict(
        stride=list(m.stride),
        padding=list(padding),
        dilation=list(m.dilation),
        transposed=transposed,
        output_padding=list(m.output_padding) if transposed else [0] * dims,
    )
    return a, geometry


def _weight_grad(a: torch.Tensor, g: torch.Tensor, shape, groups: int, geometry: dict):
    """The weight gradient of a convolution with input a and output gradient g (no bias,
    no input gradient): what autograd's convolution backward computes for the weight."""
    weight = g.new_empty(1).expand(shape)
    return torch.ops.aten.convolution_backward(
        g, a, weight, None, **geometry, groups=groups, output_mask=[False, True, False]
    )[1]


def _conv(m: _ConvNd, a: torch.Tensor, g: torch.Tensor, mode: str) -> _LayerGrads:
    """Conv/ConvTranspose of any dimension: T = output positions, d = in/groups·kernel,
    p = out channels. Ghost norm only for ungrouped, non-transposed Conv2d (unfold)."""
    batch = len(a)
    a, geometry = _conv_geometry(m, a)
    instantiated = _bias_rows(m, g, channel_last=False)
    layer = _LayerGrads(_squares(instantiated, batch, g), instantiated)
    if not _trainable(m, "weight"):
        return layer
    shape = tuple(m.weight.shape)
    positions = g[0, 0].numel()
    d, p = m.weight[0].numel(), g.shape[1]
    ghostable = isinstance(m, nn.Conv2d) and not geometry["transposed"] and m.groups == 1
    if ghostable and _use_ghost(mode, batch, positions, d, p):
        unfolded = F.unfold(
            a, m.kernel_size, dilation=m.dilation, padding=geometry["padding"], stride=m.stride
        )  # (B, d, T)
        g3 = g.reshape(batch, p, -1)
        gram_a = unfolded.transpose(1, 2) @ unfolded
        gram_g = g3.transpose(1, 2) @ g3
        layer.sq_norms = layer.sq_norms + (gram_a * gram_g).sum((1, 2))
        layer.ghost["weight"] = lambda s: _weight_grad(
            a, g * s.reshape(-1, *[1] * (g.dim() - 1)), shape, m.groups, geometry
        )
        return layer
    folded_shape = (batch * shape[0], *shape[1:])
    grad_sample = _weight_grad(
        a.reshape(1, -1, *a.shape[2:]),
        g.reshape(1, -1, *g.shape[2:]),
        folded_shape,
        batch * m.groups,
        geometry,
    ).reshape(batch, *shape)
    layer.instantiated["weight"] = grad_sample
    layer.sq_norms = layer.sq_norms + _row_squares(grad_sample)
    return layer
