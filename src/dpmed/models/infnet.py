"""Inf-Net (Fan et al. 2020) on a from-scratch Res2Net-style GroupNorm backbone.

Backbone: stem ConvNormAct at full resolution, then `depth` (≥ 3) stages, each a 2× max-pool
and a Res2Net bottleneck (1×1 conv, 4 hierarchical 3×3 groups y_i = K_i(x_i + y_{i-1}), 1×1
conv, residual) of width·2^stage channels. Stage 1 is the low-level feature, the three deepest
stages are the high-level features.

Heads (paper [6], §3): the parallel partial decoder (PPD) aggregates the three high-level
features into a coarse global map S_g; edge attention turns the low-level feature into edge
features (and an edge map, supervised by the label boundaries); reverse attention (RA) modules
from the deepest stage up refine the map: s_l = s_{l+1} + RA(f_l · (1 − σ(fg(s_{l+1}))), edge),
where fg is the any-foreground logit logsumexp_{c≥1} s_c − s_0 (for 2 classes the usual
foreground logit). Training returns {"seg": [s_final, s_mid, s_deep, S_g], "edge": e}, all at
the input size (deep supervision of every side output); evaluation returns s_final.

`backbone_weights`: optional path of a local state_dict for the backbone (never downloaded).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dpmed.models.blocks2d import ConvNormAct, groups_for, resize_to, stage_widths


class Res2NetBlock(nn.Module):
    """Res2Net bottleneck (scale 4 when the width allows) with GroupNorm."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.scales = 4 if cout % 4 == 0 else (2 if cout % 2 == 0 else 1)
        part = cout // self.scales
        self.reduce = ConvNormAct(cin, cout, kernel=1)
        self.convs = nn.ModuleList(ConvNormAct(part, part) for _ in range(self.scales - 1))
        self.expand = nn.Conv2d(cout, cout, 1, bias=False)
        self.norm = nn.GroupNorm(groups_for(cout), cout)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.GroupNorm(groups_for(cout), cout))
            if cin != cout
            else nn.Identity()
        )
        self.act = nn.ReLU(inplace=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = torch.chunk(self.reduce(x), self.scales, dim=1)
        outs = [chunks[0]]
        previous = None
        for chunk, conv in zip(chunks[1:], self.convs, strict=True):
            previous = conv(chunk if previous is None else chunk + previous)
            outs.append(previous)
        out = self.norm(self.expand(torch.cat(outs, dim=1)))
        return self.act(out + self.shortcut(x))


class Res2NetBackbone(nn.Module):
    """Features [f_1, …, f_depth] at 1/2 … 1/2^depth of the input size."""

    def __init__(self, in_channels: int, width: int, depth: int) -> None:
        super().__init__()
        widths = stage_widths(width, depth)
        self.stem = ConvNormAct(in_channels, widths[0])
        self.pool = nn.MaxPool2d(2)
        self.stages = nn.ModuleList(
            Res2NetBlock(widths[k - 1], widths[k]) for k in range(1, depth + 1)
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        feats = []
        for stage in self.stages:
            x = stage(self.pool(x))
            feats.append(x)
        return feats


class PartialDecoder(nn.Module):
    """Parallel partial decoder over (f_c, f_b, f_a), from finer to coarser, all `width` ch."""

    def __init__(self, width: int, n_classes: int) -> None:
        super().__init__()
        self.up1 = ConvNormAct(width, width)
        self.up2 = ConvNormAct(width, width)
        self.up3 = ConvNormAct(width, width)
        self.up4 = ConvNormAct(width, width)
        self.up5 = ConvNormAct(2 * width, 2 * width)
        self.cat2 = ConvNormAct(2 * width, 2 * width)
        self.cat3 = ConvNormAct(3 * width, 3 * width)
        self.conv4 = ConvNormAct(3 * width, 3 * width)
        self.out = nn.Conv2d(3 * width, n_classes, 1)

    def forward(self, fc: torch.Tensor, fb: torch.Tensor, fa: torch.Tensor) -> torch.Tensor:
        x2 = self.up1(resize_to(fa, fb)) * fb
        x3 = self.up2(resize_to(fa, fc)) * self.up3(resize_to(fb, fc)) * fc
        x2 = self.cat2(torch.cat([x2, self.up4(resize_to(fa, fb))], dim=1))
        x3 = self.cat3(torch.cat([x3, self.up5(resize_to(x2, fc))], dim=1))
        return self.out(self.conv4(x3))


class ReverseAttention(nn.Module):
    """s_l = s + head(cat[reduce(f) · (1 − σ(fg(s))), edge])."""

    def __init__(self, cin: int, width: int, n_classes: int) -> None:
        super().__init__()
        self.reduce = ConvNormAct(cin, width, kernel=1)
        self.mix = ConvNormAct(2 * width, width)
        self.refine = ConvNormAct(width, width)
        self.out = nn.Conv2d(width, n_classes, 1)

    def forward(self, feat: torch.Tensor, prior: torch.Tensor, edge: torch.Tensor) -> torch.Tensor:
        prior = resize_to(prior, feat)
        fg = torch.logsumexp(prior[:, 1:], dim=1, keepdim=True) - prior[:, :1]
        reverse = 1.0 - torch.sigmoid(fg)
        h = self.reduce(feat) * reverse
        h = self.refine(self.mix(torch.cat([h, resize_to(edge, feat)], dim=1)))
        return prior + self.out(h)


class InfNet(nn.Module):
    """Input (B, in_channels, H, W), H, W divisible by 2^depth → (B, n_classes, H, W) logits."""

    def __init__(
        self,
        in_channels: int,
        n_classes: int,
        width: int = 32,
        depth: int = 4,
        backbone_weights: str | Path | None = None,
    ) -> None:
        super().__init__()
        if depth < 3:
            raise ValueError(f"Inf-Net needs depth ≥ 3 (three high-level stages), got {depth}")
        if n_classes < 2:
            raise ValueError("Inf-Net needs ≥ 2 class logits (background + foreground)")
        widths = stage_widths(width, depth)
        self.backbone = Res2NetBackbone(in_channels, width, depth)
        if backbone_weights is not None:  # a local state_dict; errors name the file
            path = Path(backbone_weights)
            if not path.is_file():
                raise FileNotFoundError(f"{path}: Inf-Net backbone weights not found")
            state = torch.load(path, map_location="cpu", weights_only=True)
            try:
                self.backbone.load_state_dict(state, strict=True)
            except RuntimeError as err:
                raise ValueError(
                    f"{path}: not a state_dict of this Res2Net backbone: {err}"
                ) from err
        self.lateral = nn.ModuleList(ConvNormAct(widths[k], width, kernel=1) for k in (-3, -2, -1))
        self.decoder = PartialDecoder(width, n_classes)
        self.edge_feat = ConvNormAct(widths[1], width)
        self.edge_out = nn.Conv2d(width, 1, 1)
        self.attention = nn.ModuleList(
            ReverseAttention(widths[k], width, n_classes) for k in (-1, -2, -3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor | dict[str, object]:
        feats = self.backbone(x)
        high = feats[-3:]
        fc, fb, fa = (lat(f) for lat, f in zip(self.lateral, high, strict=True))
        global_map = self.decoder(fc, fb, fa)
        edge = self.edge_feat(feats[0])
        maps = []
        prior = global_map
        for module, feat in zip(self.attention, reversed(high), strict=True):
            prior = module(feat, prior, edge)
            maps.append(prior)
        final = resize_to(maps[-1], x)
        if not self.training:
            return final
        side = [resize_to(m, x) for m in (maps[-2], maps[-3], global_map)]
        return {"seg": [final, *side], "edge": resize_to(self.edge_out(edge), x)}
