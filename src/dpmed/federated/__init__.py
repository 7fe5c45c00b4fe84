"""Federated learning in-process: collaborator selection, aggregation (FedAvg, SimAgg,
DP-SimAgg paper/sound, DP-FedAvg), FeTS timing, the simulation loop and resource metering."""
