# enspipe experiment workflow: the shared data stage, calibration, idle power, one MPI job per
# cell, one tidy table of all cells, and the paper's figures and tables (results/figures/;
# `snakemake --report results/report.html` for the HTML report). Configs in config/, rules in workflow/rules/.
#   snakemake --cores 2                                     the embedded default, locally
#   snakemake --profile slurm --configfile config/paper.yaml   the paper's grid on a cluster


import os


# The embedded default experiment, unless the command line names its own: a --configfile is the
# whole experiment, never merged into this one (test.yaml must not inherit the default's cells).
if not workflow.overwrite_configfiles:

    configfile: os.path.join(workflow.basedir, "config", "config.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/calibration.smk"
include: "workflow/rules/power.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/ensemble.smk"
include: "workflow/rules/collect.smk"
include: "workflow/rules/figures.smk"


rule all:
    input:
        "results/tables/cells.csv",
        "results/calibration/rates.json",
        "results/figures/paper_vs_run.md",
        "results/tables/dataset.csv",
    default_target: True
