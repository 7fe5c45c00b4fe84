"""fets study (paper 000): federated DP-SimAgg on FeTS 2022."""
