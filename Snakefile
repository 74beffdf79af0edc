# enspipe experiment workflow: the shared data stage, calibration, idle power, one MPI job per
# cell, and one tidy table of all cells. Configs in config/, rules in workflow/rules/.
#   snakemake --cores 2                                     the embedded default, locally
#   snakemake --profile slurm --configfile config/paper.yaml   the paper's grid on a cluster


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/calibration.smk"
include: "workflow/rules/power.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/collect.smk"
include: "workflow/rules/figures.smk"


rule all:
    input:
        "results/tables/cells.csv",
        "results/calibration/rates.json",
        "results/figures/fig10_peak_throughput.png",
        "results/figures/fig12_cpu_reduction.png",
        "results/figures/table3_slowdown_1core.md",
    default_target: True
