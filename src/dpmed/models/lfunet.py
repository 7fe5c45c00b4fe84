"""LFUNet (lightweight U-Net with full skip connections, dilated convolutions and deep
supervision; paper 002 §2.2 after [13, 11]), with GroupNorm.

Encoder: `depth` down-sampling stages of doubling width; the bottleneck is a stack of dilated
3×3 convolutions (dilation 2 and 4) that enlarges the receptive field without down-sampling.
Full-scale skips (UNet 3+ style): decoder level i concatenates, each projected to `width`
channels by its own ConvNormAct, every encoder map at levels ≤ i (max-pooled down to level i)
and every deeper decoder map (bilinearly up-sampled), then fuses them with a ConvNormAct.
Deep supervision: a 1×1 head on every decoder level, up-sampled to the input size; training
returns the list (finest first), evaluation the finest head.
"""

from __future__ import annotations

import torch
from torch import nn

from dpmed.models.blocks2d import ConvNormAct, DoubleConv, pool_to, resize_to, stage_widths


class LFUNet(nn.Module):
    """Input (B, in_channels, H, W), H, W divisible by 2^depth → (B, n_classes, H, W) logits."""

    def __init__(
        self,
        in_channels: int,
        n_classes: int,
        width: int = 32,
        depth: int = 4,
        deep_supervision: bool = True,
    ) -> None:
        super().__init__()
        widths = stage_widths(width, depth)
        self.depth = depth
        self.deep_supervision = deep_supervision
        self.pool = nn.MaxPool2d(2)
        self.encoders = nn.ModuleList(
            DoubleConv(cin, cout)
            for cin, cout in zip([in_channels, *widths[:-2]], widths[:-1], strict=True)
        )
        self.bottleneck = nn.Sequential(
            ConvNormAct(widths[-2], widths[-1], dilation=1),
            ConvNormAct(widths[-1], widths[-1], dilation=2),
            ConvNormAct(widths[-1], widths[-1], dilation=4),
        )
        # projections[i][source]: source = encoder level (≤ i) or deeper decoder level (> i)
        self.projections = nn.ModuleList()
        self.fuse = nn.ModuleList()
        for level in range(depth):
            sources = nn.ModuleDict()
            for enc in range(level + 1):
                sources[f"e{enc}"] = ConvNormAct(widths[enc], width)
            for dec in range(level + 1, depth + 1):
                cin = widths[-1] if dec == depth else width * (depth + 1)
                sources[f"d{dec}"] = ConvNormAct(cin, width)
            self.projections.append(sources)
            self.fuse.append(ConvNormAct(width * (depth + 1), width * (depth + 1)))
        n_heads = depth if deep_supervision else 1
        self.heads = nn.ModuleList(
            nn.Conv2d(width * (depth + 1), n_classes, 1) for _ in range(n_heads)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        encoded = []
        for level, encoder in enumerate(self.encoders):
            x = encoder(x if level == 0 else self.pool(x))
            encoded.append(x)
        decoded = {self.depth: self.bottleneck(self.pool(x))}
        for level in reversed(range(self.depth)):
            ref = encoded[level]
            sources = self.projections[level]
            parts = [sources[f"e{e}"](pool_to(encoded[e], ref)) for e in range(level + 1)]
            parts += [
                resize_to(sources[f"d{d}"](decoded[d]), ref)
                for d in range(level + 1, self.depth + 1)
            ]
            decoded[level] = self.fuse[level](torch.cat(parts, dim=1))
        if not self.deep_supervision or not self.training:
            return self.heads[0](decoded[0])
        return [resize_to(head(decoded[j]), encoded[0]) for j, head in enumerate(self.heads)]
