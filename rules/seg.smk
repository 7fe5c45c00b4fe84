"""seg study (paper 002): DP-SGD clipping rules × DP-Morph segmentation."""
