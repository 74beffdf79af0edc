rule collect:
    """One tidy table of all cells (results/tables/cells.csv)."""
    input:
        summaries=[RUNS.format(cell=cell.name) for cell in CELLS],
    output:
        table="results/tables/cells.csv",
    conda:
        ENV
    log:
        "results/logs/collect.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    localrule: True
    script:
        "../scripts/collect.py"


rule collect_lag:
    """The lag cells' members (results/tables/lag.csv; empty without a lag section)."""
    input:
        summaries=[LAG.format(scheme=s) for s in LAG_CELLS],
    output:
        table="results/tables/lag.csv",
    conda:
        ENV
    log:
        "results/logs/collect_lag.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    localrule: True
    script:
        "../scripts/collect_lag.py"
