"""fets study (paper 000): DP-SimAgg federated 3D brain-tumour segmentation on FeTS 2022."""
