"""EfficientNet-B0 for the xcal study: MONAI's EfficientNet with the B0 block list, GroupNorm
and no in-place swish (Opacus-valid). Kept out of `dpmed.models.classifiers` because importing
MONAI loads every MONAI submodule (about 1.5 s per process), which only the jobs that build this
network should pay."""

from __future__ import annotations

import torch
from monai.networks.nets.efficientnet import EfficientNet

from dpmed.models.classifiers import INPUT_MEAN, INPUT_STD, check_input, norm_groups
from dpmed.models.deterministic import replace_global_pools

EFFICIENTNET_B0 = [
    "r1_k3_s11_e1_i32_o16_se0.25",
    "r2_k3_s22_e6_i16_o24_se0.25",
    "r2_k5_s22_e6_i24_o40_se0.25",
    "r3_k3_s22_e6_i40_o80_se0.25",
    "r3_k5_s11_e6_i80_o112_se0.25",
    "r4_k5_s22_e6_i112_o192_se0.25",
    "r1_k3_s11_e6_i192_o320_se0.25",
]


class EfficientNetB0(EfficientNet):
    """MONAI EfficientNet with the B0 block list, GroupNorm and no in-place swish;
    `width_scale` is the width coefficient, and MONAI's static "same" padding follows
    `image_size`."""

    grad_sample_mode = "bk"

    def __init__(
        self, in_channels: int, n_classes: int, image_size: int, width_scale: float = 1.0
    ) -> None:
        check_input(in_channels, image_size)
        super().__init__(
            blocks_args_str=EFFICIENTNET_B0,
            spatial_dims=2,
            in_channels=in_channels,
            num_classes=n_classes,
            width_coefficient=width_scale,
            depth_coefficient=1.0,
            dropout_rate=0.2,
            image_size=image_size,
            norm=("group", {"num_groups": norm_groups(width_scale)}),
            drop_connect_rate=0.0,
        )
        self.set_swish(memory_efficient=False)
        replace_global_pools(self)  # head and squeeze-excitation pools, deterministic on CUDA

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward((x - INPUT_MEAN) / INPUT_STD)

    def cam_candidates(self) -> list[str]:
        """The output of every MBConv block, shallow to deep."""
        return [f"_blocks.{i}" for i in range(len(self._blocks))]
