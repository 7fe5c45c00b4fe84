"""dpmed: three studies of differentially private deep learning on medical images.

    snakemake --profile profiles/local --configfile config/smoke.yaml   # tiny synthetic grid
    snakemake --profile profiles/slurm                                   # paper grids (config/config.yaml)

See README.md for partial reruns and real data.
"""

import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

# The library lives in src/. Snakemake puts this process's sys.path into the preamble of every
# `script:` job (local, conda or SLURM), so `dpmed` imports there whether or not it is installed.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from dpmed.config.checks import load_config_file


# config/config.yaml (next to this file, whatever --directory says) unless the command line
# names whole config files (--configfile), which then replace it instead of being merged into it.
# Snakemake reads a --configfile before this file runs, and its message for a YAML syntax error
# names neither file nor line (`snakemake --verbose` shows both; so does
# `python -m dpmed.config.checks FILE`); the default file is read here first to name them.
if not workflow.config_settings.configfiles:
    load_config_file(Path(workflow.basedir) / "config" / "config.yaml")

    configfile: Path(workflow.basedir) / "config" / "config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/seg.smk"
include: "rules/fets.smk"
include: "rules/xcal.smk"
include: "rules/report.smk"


report: "workflow/report/workflow.rst"


rule all:
    default_target: True
    input:
        data_targets(),
        study_targets(),
        REPORT_TARGETS,
