rule collect:
    """One tidy table of all cells (results/tables/cells.csv)."""
    input:
        summaries=[cell.path for cell in CELLS],
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
