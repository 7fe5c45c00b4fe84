"""dpmed: three studies of differentially private deep learning on medical images.

    snakemake --profile profiles/local --configfile config/smoke.yaml   # tiny synthetic grid
    snakemake --profile profiles/slurm                                   # paper grids (config/config.yaml)

See README.md for partial reruns and real data.
"""

from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


# config/config.yaml (next to this file, whatever --directory says) unless the command line
# names whole config files (--configfile), which then replace it instead of being merged into it.
if not workflow.config_settings.configfiles:

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
