rule figures:
    """The paper's figures (PNG, PDF) and tables (CSV, Markdown) and the paper-vs-this-run table,
    from the tidy table of cells and the cells' own logs; in the HTML report (snakemake --report)
    the PNGs and CSVs, each with its caption from workflow/report/."""
    input:
        table="results/tables/cells.csv",
        rates="results/calibration/rates.json",
        idle="results/idle/power.json",
        lag="results/tables/lag.csv",
        comm=COMM,
        paper=PAPER_CONFIG,
        ensembles=ENSEMBLES,
    output:
        figures.workflow_outputs(report, "results/figures", "../report"),  # the registry in report/outputs.py
    conda:
        ENV
    log:
        "results/logs/figures.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    localrule: True
    script:
        "../scripts/figures.py"
