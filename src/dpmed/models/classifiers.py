"""Image classifiers for the xcal study: ResNet-18 and EfficientNet-B0, both Opacus-valid.
Built through the model registry (`dpmed.models.build_model("resnet18", in_channels=...,
n_classes=..., image_size=..., width_scale=...)`).

Inputs are (B, C, H, W) float images in [0, 1] with C = 1 or 3 and 28 ≤ H = W ≤ 224,
standardised inside the model as (x − 0.5)/0.25 (without it the images' large mean dominates the
first GroupNorm and training is slower); outputs are (B, n_classes) logits. Opacus validity:
GroupNorm instead of BatchNorm (per-sample gradients need layers that do not mix samples), no
in-place op after a hooked layer (`inplace=False`, `out = out + identity`), no shared modules.

- ResNet-18 is written by hand (MONAI's keeps BatchNorms inside blocks and uses `+=`). Inputs
  below 128² get the CIFAR stem (3×3 conv, stride 1, no max-pool) so the stage-3 map is ≥ 7×7 at
  28²; larger inputs get the ImageNet stem (7×7 stride 2 + max-pool).
- EfficientNet-B0 (`dpmed.models.efficientnet`, its own module so that only the jobs that build
  it pay MONAI's import, about 1.5 s) is MONAI's `EfficientNet(blocks_args_str=B0,
  image_size=H)` (its static "same" padding follows the configured size, unlike
  `EfficientNetBN`'s hard-coded 224²), with GroupNorm, the non-in-place swish and no
  drop-connect.

`width_scale` multiplies the channel widths (1.0 = the published networks; smaller values make
the tiny smoke models). Each class names the per-sample-gradient engine that is fast for it
(`grad_sample_mode`: the one-backward book-keeping engine `bk` for both; bench/dp_step.py
compares it with Opacus hooks/functorch) and its Grad-CAM candidates (`cam_candidates`);
`gradcam_layer` picks the deepest feature map that is still at least 7×7 at the input size.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dpmed.models.deterministic import GlobalAvgPool2d

MIN_CAM_SIZE = 7
IN_CHANNELS = (1, 3)
IMAGE_SIZES = (28, 224)  # smallest and largest side
INPUT_MEAN, INPUT_STD = 0.5, 0.25  # fixed standardisation of [0, 1] inputs inside the models
GROUPS = 8  # GroupNorm groups at full width; every width used here is a multiple of 8


def check_input(in_channels: int, image_size: int) -> None:
    """Refuse inputs the classifiers are not built for (channels 1 or 3, side 28 to 224)."""
    if in_channels not in IN_CHANNELS:
        raise ValueError(f"in_channels must be 1 or 3, got {in_channels}")
    if not IMAGE_SIZES[0] <= image_size <= IMAGE_SIZES[1]:
        raise ValueError(f"image_size must be in [28, 224], got {image_size}")


def norm_groups(width_scale: float) -> int:
    """GroupNorm groups: 8 at full width, halved with every halving of the width (at least 1),
    so narrow smoke models keep several channels per group instead of per-channel (instance)
    normalisation, which would erase the colour cues of the images. Divides every width."""
    return int(min(GROUPS, max(1, 2 ** round(math.log2(GROUPS * width_scale)))))


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(groups, channels), channels)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3×3 conv-GN layers and an identity (or 1×1 projection) skip."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.norm1 = _norm(out_ch, groups)
        self.act1 = nn.ReLU(inplace=False)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.norm2 = _norm(out_ch, groups)
        self.act2 = nn.ReLU(inplace=False)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), _norm(out_ch, groups)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        out = out + self.shortcut(x)
        return self.act2(out)


class ResNet18(nn.Module):
    """ResNet-18 (2-2-2-2 basic blocks, widths 64·s, 128·s, 256·s, 512·s with s =
    `width_scale`) with GroupNorm; the CIFAR stem below `image_size` 128."""

    grad_sample_mode = "bk"

    def __init__(
        self, in_channels: int, n_classes: int, image_size: int, width_scale: float = 1.0
    ) -> None:
        check_input(in_channels, image_size)
        super().__init__()
        widths = [
            max(GROUPS, round(w * width_scale / GROUPS) * GROUPS) for w in (64, 128, 256, 512)
        ]
        groups = norm_groups(width_scale)
        if image_size < 128:
            stem = [nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)]
            pool: list[nn.Module] = []
        else:
            stem = [nn.Conv2d(in_channels, widths[0], 7, 2, 3, bias=False)]
            pool = [nn.MaxPool2d(3, 2, 1)]
        self.stem = nn.Sequential(*stem, _norm(widths[0], groups), nn.ReLU(inplace=False), *pool)
        stages, in_ch = [], widths[0]
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            stages.append(
                nn.Sequential(BasicBlock(in_ch, w, stride, groups), BasicBlock(w, w, 1, groups))
            )
            in_ch = w
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = GlobalAvgPool2d()  # = nn.AdaptiveAvgPool2d(1), deterministic on CUDA
        self.fc = nn.Linear(in_ch, n_classes)

    def cam_candidates(self) -> list[str]:
        """Names of the feature maps Grad-CAM may use, shallow to deep."""
        return ["layer1", "layer2", "layer3", "layer4"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem((x - INPUT_MEAN) / INPUT_STD)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def feature_sizes(model: nn.Module, in_channels: int, image_size: int) -> dict[str, int]:
    """Spatial side of every Grad-CAM candidate's output for one input of the given size."""
    sizes: dict[str, int] = {}
    modules = dict(model.named_modules())
    handles = [
        modules[name].register_forward_hook(
            lambda _m, _i, out, name=name: sizes.__setitem__(name, int(min(out.shape[-2:])))
        )
        for name in model.cam_candidates()
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            param = next(model.parameters())
            model(torch.zeros(1, in_channels, image_size, image_size, device=param.device))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return sizes


def gradcam_layer(model: nn.Module, in_channels: int, image_size: int) -> str:
    """Name of the deepest candidate feature map whose side is ≥ `MIN_CAM_SIZE` (7)."""
    sizes = feature_sizes(model, in_channels, image_size)
    fitting = [name for name in model.cam_candidates() if sizes[name] >= MIN_CAM_SIZE]
    if not fitting:
        raise ValueError(f"no feature map of {type(model).__name__} is ≥ 7×7 at {image_size}²")
    return fitting[-1]
