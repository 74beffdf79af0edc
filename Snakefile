# enspipe experiment workflow (minimal: the full cell grid, Slurm profile and figures are built on this).
configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/cells.smk"


rule all:
    input:
        expand(CELL_SUMMARY, scheme=config["schemes"], allow_missing=True),
    default_target: True
