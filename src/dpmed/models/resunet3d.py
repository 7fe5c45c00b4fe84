"""3D residual U-Net for brain-tumour segmentation (FeTS Task 1 model, GaNDLF `resunet` shape).

Encoder: an input residual block at `base_filters` channels, then `depth` levels that each
halve the resolution with a strided 3³ convolution and double the channels, followed by a
residual block (two 3³ conv-norm-LeakyReLU layers plus a 1³ projection shortcut when the
channels change). Decoder: per level a 2³ transposed convolution, concatenation with the
encoder feature map, and a residual block; a 1³ convolution gives the class logits.
With 4 input channels, 4 classes, base 32 and depth 4 it has ≈ 33 M parameters (the paper's
"≈ 33 M"); inputs need sides divisible by 2^depth (64³ patches in the paper).

Opacus-valid and federated-safe: GroupNorm (or InstanceNorm without running statistics), no
in-place ops, so the state dict holds trained parameters only (no buffers to aggregate).
"""

from __future__ import annotations

import torch
from torch import nn

from dpmed.models import NORMS_3D as NORMS


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "group":
        return nn.GroupNorm(min(8, channels), channels)
    if kind == "instance":
        return nn.InstanceNorm3d(channels, affine=True, track_running_stats=False)
    raise ValueError(f"unknown norm '{kind}' (known: {', '.join(NORMS)})")


class ResBlock3d(nn.Module):
    """x → conv-norm-act-conv-norm + shortcut(x) → act."""

    def __init__(self, cin: int, cout: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(cin, cout, 3, padding=1, bias=False)
        self.norm1 = _norm(norm, cout)
        self.conv2 = nn.Conv3d(cout, cout, 3, padding=1, bias=False)
        self.norm2 = _norm(norm, cout)
        self.act = nn.LeakyReLU(0.01, inplace=False)
        self.shortcut = nn.Conv3d(cin, cout, 1, bias=False) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        out = out + self.shortcut(x)
        return self.act(out)


class Down3d(nn.Module):
    """Strided 3³ conv (halves each side, sets channels) then a residual block."""

    def __init__(self, cin: int, cout: int, norm: str) -> None:
        super().__init__()
        self.down = nn.Conv3d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.norm = _norm(norm, cout)
        self.act = nn.LeakyReLU(0.01, inplace=False)
        self.block = ResBlock3d(cout, cout, norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.act(self.norm(self.down(x))))


class Up3d(nn.Module):
    """2³ transposed conv (doubles each side), concat the skip, residual block."""

    def __init__(self, cin: int, cskip: int, cout: int, norm: str) -> None:
        super().__init__()
        self.up = nn.ConvTranspose3d(cin, cout, 2, stride=2)
        self.block = ResBlock3d(cout + cskip, cout, norm)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.block(torch.cat([self.up(x), skip], dim=1))


class ResUNet3d(nn.Module):
    """(B, in_channels, X, Y, Z) → logits (B, n_classes, X, Y, Z)."""

    def __init__(
        self,
        in_channels: int = 4,
        n_classes: int = 4,
        base_filters: int = 32,
        depth: int = 4,
        norm: str = "group",
    ) -> None:
        super().__init__()
        widths = [base_filters * 2**i for i in range(depth + 1)]
        self.depth = depth
        self.stem = ResBlock3d(in_channels, widths[0], norm)
        self.downs = nn.ModuleList(Down3d(widths[i], widths[i + 1], norm) for i in range(depth))
        self.ups = nn.ModuleList(
            Up3d(widths[i + 1], widths[i], widths[i], norm) for i in reversed(range(depth))
        )
        self.head = nn.Conv3d(widths[0], n_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.stem(x)]
        for down in self.downs:
            skips.append(down(skips[-1]))
        out = skips.pop()
        for up in self.ups:
            out = up(out, skips.pop())
        return self.head(out)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
