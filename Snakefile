"""dpmed: three studies of differentially private deep learning on medical images.

    snakemake --profile profiles/local --configfile config/smoke.yaml   # tiny synthetic grid
    snakemake --profile slurm        # paper grids (config/config.yaml); `make slurm-profile` first

See README.md for partial reruns and real data.
"""

import posixpath

from snakemake.sourcecache import LocalGitFile
from snakemake.utils import min_version

min_version("9.0")

# This workflow's own folder: the main Snakefile's, or the module's when another workflow uses
# dpmed through `module dpmed: snakefile: ...` (workflow.basedir is then the *other* workflow's).
# A versioned source (`github("<owner>/dpmed", path="Snakefile", tag=...)`, or
# `git+file://<clone>/Snakefile@<tag>`) is read out of git, not from a folder: DPMED_ROOT is None.
_SOURCE = workflow.current_basedir


# rules/source.smk, the file beside this one (joined by hand for a git+file source: Snakemake 9
# joins a path to a Snakefile at the top of a git repository as `/<path>`, which git cannot show).
_SOURCE_RULES = (
    LocalGitFile(
        _SOURCE.repo_path,
        posixpath.normpath(posixpath.join(_SOURCE.path, "rules/source.smk")),
        ref=_SOURCE.ref,
    )
    if isinstance(_SOURCE, LocalGitFile)
    else "rules/source.smk"
)


include: _SOURCE_RULES


from dpmed.config.checks import check_complete, load_config_file


# config/config.yaml (next to this file, whatever --directory says) unless the command line
# names whole config files (--configfile), which then replace it instead of being merged into it.
# Snakemake reads a --configfile before this file runs, keeps the last value of a key given twice,
# and its message for a YAML syntax error names neither file nor line (`snakemake --verbose` shows
# both; so does `python -m dpmed.config.checks FILE`): every config file is read here again with
# dpmed's strict loader, which names file, line and key of both.
# A workflow that uses dpmed as a module passes its own config (`config: config`) and Snakemake
# then skips this configfile.
CONFIG_FILES = workflow.config_settings.configfiles or [dpmed_file("config/config.yaml")]
for _path in CONFIG_FILES:
    load_config_file(_path)
if not workflow.config_settings.configfiles:

    configfile: dpmed_file("config/config.yaml")


# A config that lacks a required section (a --configfile of a few overrides) stops here with a
# line naming its files and what they lack, and the hint to start from a complete file.
check_complete(config, dpmed_file("config/schema.yaml"), CONFIG_FILES)


include: dpmed_source("rules/common.smk")
include: dpmed_source("rules/data.smk")


# Each registered study's own rule file, in its package (dpmed.studies).
for _study in STUDIES:

    include: dpmed_source(f"src/dpmed/{_study}/rules.smk")


include: dpmed_source("rules/audit.smk")
include: dpmed_source("rules/report.smk")
include: dpmed_source("rules/preflight.smk")


# `--config preflight=true` (or `sample`) targets the preflight's outputs instead of the grid's.
GRID_TARGETS = [data_targets(), study_targets(), REPORT_TARGETS]


rule all:
    default_target: True
    input:
        rules.preflight.output if PREFLIGHT_MODE != "off" else GRID_TARGETS,
