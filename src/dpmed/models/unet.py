"""U-Net (Ronneberger et al. 2015) with GroupNorm: `depth` down-sampling stages of doubling
width, bilinear up-sampling + concatenated skip connections, 1×1 head to class logits."""

from __future__ import annotations

import torch
from torch import nn

from dpmed.models.blocks2d import DoubleConv, resize_to, stage_widths


class UNet(nn.Module):
    """Input (B, in_channels, H, W) with H, W divisible by 2^depth → logits (B, n_classes, H, W)."""

    def __init__(self, in_channels: int, n_classes: int, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        widths = stage_widths(width, depth)
        self.pool = nn.MaxPool2d(2)
        self.encoders = nn.ModuleList(
            DoubleConv(cin, cout)
            for cin, cout in zip([in_channels, *widths[:-1]], widths, strict=True)
        )
        self.decoders = nn.ModuleList(
            DoubleConv(widths[level] + widths[level + 1], widths[level])
            for level in reversed(range(depth))
        )
        self.head = nn.Conv2d(widths[0], n_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for level, encoder in enumerate(self.encoders):
            x = encoder(x if level == 0 else self.pool(x))
            skips.append(x)
        x = skips.pop()
        for decoder in self.decoders:
            skip = skips.pop()
            x = decoder(torch.cat([skip, resize_to(x, skip)], dim=1))
        return self.head(x)
