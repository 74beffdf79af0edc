rule figures:
    """The paper's figures and tables built so far (issue 6 adds the rest), from the tidy table."""
    input:
        table="results/tables/cells.csv",
        rates="results/calibration/rates.json",
    output:
        multiext("results/figures/fig10_peak_throughput", ".png", ".pdf"),
        multiext("results/figures/fig12_cpu_reduction", ".png", ".pdf", ".csv", ".md"),
        multiext("results/figures/table3_slowdown_1core", ".csv", ".md"),
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
