"""seg study (paper 002): DP-SGD segmentation with clipping rules and DP-Morph."""
