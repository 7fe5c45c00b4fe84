"""Preflight: before a cluster hour is spent, every distinct cell of a grid builds its real
model at the configured size, calibrates σ for each of its ε, runs a few real training steps in
a child process (time per step, peak memory, parameters), is compared with the SLURM request of
its rule (`dpmed.job_cost`), and the whole grid gets a projected cost (docs/preflight.md).

    python -m dpmed.preflight [--config FILE ...] [--sample] [--out results/preflight]
"""
