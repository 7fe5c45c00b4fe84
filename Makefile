# The two commands of the README: `make demo` and `make test`.
# Both create .venv if missing and install the pinned dependencies (torch==2.13.0 is the CPU
# wheel on the project machines; a bare `torch` would download a multi-GB CUDA build).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CORES  ?= 2

.PHONY: demo verdicts test test-slurm test-fl fl-openfl fl-flower install clean-demo slurm-profile preflight

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

SMOKE := --profile profiles/local --configfile config/smoke.yaml --cores $(CORES)
# The claims verdicts counted per paper, printed at the end of `demo` and `verdicts`.
COUNTS := $(BIN)/python -c "import sys, pandas as pd; \
	print(pd.read_csv(sys.argv[1]).to_string(index=False))"

demo: $(STAMP)
	$(BIN)/snakemake $(SMOKE)
	$(BIN)/snakemake $(SMOKE) --report results/report.html
	@echo "demo finished: report at $(CURDIR)/results/report.html" \
	      "(tables in results/tables/, figures in results/figures/, wall-clock in results/measured/)"
	@$(COUNTS) results/tables/claims_counts.csv

# The cells of every claim decidable on 2 cores, with enough seeds to decide them
# (config/verdicts.yaml on top of config/smoke.yaml, docs/verdicts.md), into runs/verdicts/ so the
# demo's results/ stay as they are.
VERDICTS_DIR := $(CURDIR)/runs/verdicts
VERDICTS := --profile profiles/local --configfile config/smoke.yaml config/verdicts.yaml \
	--directory $(VERDICTS_DIR) --cores $(CORES)

verdicts: $(STAMP)
	mkdir -p $(VERDICTS_DIR)
	$(BIN)/snakemake $(VERDICTS)
	$(BIN)/snakemake $(VERDICTS) --report $(VERDICTS_DIR)/results/report.html
	@echo "verdicts finished: claims in $(VERDICTS_DIR)/results/tables/claims.csv," \
	      "power plan in power_plan.csv beside it, report at $(VERDICTS_DIR)/results/report.html"
	@$(COUNTS) $(VERDICTS_DIR)/results/tables/claims_counts.csv

# Two pytest-xdist workers; the tests of the one shared smoke run go to one of them (tests/conftest.py).
test: $(STAMP)
	$(BIN)/python -m pytest -n $(CORES) --dist loadgroup --no-loadscope-reorder

# Every distinct cell of the paper grid (or CONFIG=...): real model and input size, sigma for every
# eps, a few real training steps in a child process each, the SLURM request it must fit, and the
# projected cost (docs/preflight.md). Not part of `make test`; writes results/preflight/ with its
# report (report.html: the tables and the cost figure), and fails when any cell failed.
CONFIG ?= config/config.yaml
preflight: $(STAMP)
	$(BIN)/dpmed preflight --config $(CONFIG) --out results/preflight; status=$$?; \
	$(BIN)/snakemake --profile profiles/local --configfile $(CONFIG) --cores $(CORES) \
	    --config preflight=true --report results/preflight/report.html; exit $$status

# One smoke cell of each study through a real one-node SLURM cluster started on this machine
# (needs root: installs slurmctld, slurmd, slurm-client and munge from Debian if missing).
test-slurm: $(STAMP)
	tests/slurm/local_cluster.sh

# The two federated methods in the FL engines sites deploy (docs/deploy.md), on the synthetic
# data, every process on 127.0.0.1 and stopped by pid: DP-SimAgg as an OpenFL 1.9 federation
# (an aggregator and 3 collaborator processes over gRPC), XCal-FL as a Flower app (per job a
# SuperLink with TLS and SuperNode authentication, and 3 SuperNodes registered with their keys;
# test-fl also runs `flwr run . local-simulation`). Both draw their noise from OS entropy, as a
# deployment must; `--seeded` (same option on both) uses the job seeds instead, which test-fl
# does to check both against the in-process simulation (pytest marker fl).
fl-openfl: $(STAMP)
	$(BIN)/dpmed fl-openfl --out results/fl/openfl

fl-flower: $(STAMP)
	$(BIN)/dpmed fl-flower --out results/fl/flower

test-fl: $(STAMP)
	$(BIN)/python -m pytest -m fl

# The SLURM site profile, installed where `snakemake --profile slurm` finds it
# (~/.config/snakemake/slurm/; never overwritten). Optional: ACCOUNT=, CPU_PARTITION=, GPU_PARTITION=.
# Standard library only, so it runs on a login node before `make install`.
slurm-profile:
	PYTHONPATH=src python3 -m dpmed.slurm_profile --template profiles/slurm-template \
	    --account "$(ACCOUNT)" --cpu-partition "$(CPU_PARTITION)" --gpu-partition "$(GPU_PARTITION)"

clean-demo:
	rm -rf data results logs benchmarks .snakemake
