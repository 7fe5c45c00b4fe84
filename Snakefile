"""dpmed: three studies of differentially private deep learning on medical images.

    snakemake --profile profiles/local --configfile config/smoke.yaml   # tiny synthetic grid
    snakemake --profile slurm        # paper grids (config/config.yaml); `make slurm-profile` first

See README.md for partial reruns and real data.
"""

import os
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

# This workflow's own folder: the main Snakefile's, or the module's when another workflow uses
# dpmed through `module dpmed: snakefile: ...` (workflow.basedir is then the *other* workflow's).
DPMED_ROOT = Path(workflow.current_basedir)
# The library lives in src/. It goes first on sys.path here and first on PYTHONPATH for every job
# (Snakemake only appends this process's sys.path to a `script:` job's), so an installed dpmed
# or another checkout's editable install never runs in place of this workflow's code.
DPMED_SRC = str(DPMED_ROOT / "src")
sys.path.insert(0, DPMED_SRC)
os.environ.update(
    PYTHONPATH=os.pathsep.join(
        [DPMED_SRC, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
)

from dpmed.config.checks import load_config_file


# config/config.yaml (next to this file, whatever --directory says) unless the command line
# names whole config files (--configfile), which then replace it instead of being merged into it.
# Snakemake reads a --configfile before this file runs, keeps the last value of a key given twice,
# and its message for a YAML syntax error names neither file nor line (`snakemake --verbose` shows
# both; so does `python -m dpmed.config.checks FILE`): every config file is read here again with
# dpmed's strict loader, which names file, line and key of both.
# A workflow that uses dpmed as a module passes its own config (`config: config`) and Snakemake
# then skips this configfile.
for _path in workflow.config_settings.configfiles or [DPMED_ROOT / "config" / "config.yaml"]:
    load_config_file(_path)
if not workflow.config_settings.configfiles:

    configfile: DPMED_ROOT / "config" / "config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"


# Each registered study's own rule file (`StudySpec.rules`, dpmed.studies).
for _, _study in STUDIES.items():

    include: _study.rules


include: "rules/audit.smk"
include: "rules/report.smk"
include: "rules/preflight.smk"


report: "workflow/report/workflow.rst"


# `--config preflight=true` (or `sample`) targets the preflight's outputs instead of the grid's.
GRID_TARGETS = [data_targets(), study_targets(), REPORT_TARGETS]


rule all:
    default_target: True
    input:
        rules.preflight.output if PREFLIGHT_MODE != "off" else GRID_TARGETS,
