"""UNet++ (Zhou et al. 2018): nested dense skip pathways X^{i,j} with GroupNorm.

Node X^{i,j} (level i, column j ≥ 1) = DoubleConv(cat[X^{i,0}, …, X^{i,j-1}, up(X^{i+1,j-1})]).
Deep supervision: 1×1 heads on X^{0,1} … X^{0,depth}; in training the model returns the list
of their logits (the loss averages them), in evaluation the last head's logits.
"""

from __future__ import annotations

import torch
from torch import nn

from dpmed.models.blocks2d import DoubleConv, resize_to, stage_widths


class UNetPlusPlus(nn.Module):
    """Input (B, in_channels, H, W), H, W divisible by 2^depth → (B, n_classes, H, W) logits
    (a list of `depth` of them in training when `deep_supervision`)."""

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
        self.nodes = nn.ModuleDict()
        for i in range(depth + 1):
            for j in range(depth + 1 - i):
                if j == 0:
                    cin = in_channels if i == 0 else widths[i - 1]
                else:
                    cin = widths[i] * j + widths[i + 1]
                self.nodes[f"{i}_{j}"] = DoubleConv(cin, widths[i])
        n_heads = depth if deep_supervision else 1
        self.heads = nn.ModuleList(nn.Conv2d(widths[0], n_classes, 1) for _ in range(n_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        grid: dict[tuple[int, int], torch.Tensor] = {}
        for i in range(self.depth + 1):
            grid[i, 0] = self.nodes[f"{i}_0"](x if i == 0 else self.pool(grid[i - 1, 0]))
        for j in range(1, self.depth + 1):
            for i in range(self.depth + 1 - j):
                inputs = [grid[i, k] for k in range(j)]
                inputs.append(resize_to(grid[i + 1, j - 1], grid[i, 0]))
                grid[i, j] = self.nodes[f"{i}_{j}"](torch.cat(inputs, dim=1))
        if not self.deep_supervision:
            return self.heads[0](grid[0, self.depth])
        if not self.training:
            return self.heads[-1](grid[0, self.depth])
        return [head(grid[0, j + 1]) for j, head in enumerate(self.heads)]
