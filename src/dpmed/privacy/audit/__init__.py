"""Empirical privacy audit: a measured ε lower bound from one training run with canaries
(Steinke, Nasr & Jagielski 2023). `bound` turns guesses into ε; `dirac` holds DP-SGD's
white-box gradient canaries; `cell` holds what every audited cell shares. The runner that
audits a grid cell through its study's code is `dpmed.audit`, above the config and the studies."""
