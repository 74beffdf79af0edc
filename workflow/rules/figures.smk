rule figures:
    """The paper's figures (PNG, PDF) and tables (CSV, Markdown) and the paper-vs-this-run table,
    from the tidy table of cells and the cells' own logs; in the HTML report (snakemake --report)
    the PNGs and CSVs, each with its caption from workflow/report/."""
    input:
        table="results/tables/cells.csv",
        rates="results/calibration/rates.json",
        idle="results/idle/power.json",
    output:
        report("results/figures/fig03_queue_occupancy.png", caption="../report/fig03_queue_occupancy.rst", category="1 One member alone"),
        "results/figures/fig03_queue_occupancy.pdf",
        report("results/figures/fig04_core_utilisation.png", caption="../report/fig04_core_utilisation.rst", category="1 One member alone"),
        "results/figures/fig04_core_utilisation.pdf",
        report("results/figures/table1_solo_vs_parallel.csv", caption="../report/table1_solo_vs_parallel.rst", category="1 One member alone"),
        "results/figures/table1_solo_vs_parallel.md",
        report("results/figures/table2_core_usage.csv", caption="../report/table2_core_usage.rst", category="1 One member alone"),
        "results/figures/table2_core_usage.md",
        report("results/figures/fig10a_peak_full_cores.png", caption="../report/fig10a_peak_full_cores.rst", category="2 Peak throughput"),
        "results/figures/fig10a_peak_full_cores.pdf",
        report("results/figures/fig10b_peak_core_limit.png", caption="../report/fig10b_peak_core_limit.rst", category="2 Peak throughput"),
        "results/figures/fig10b_peak_core_limit.pdf",
        report("results/figures/fig11_broadcast_cpu.png", caption="../report/fig11_broadcast_cpu.rst", category="3 CPU"),
        "results/figures/fig11_broadcast_cpu.pdf",
        report("results/figures/fig11_broadcast_cpu.csv", caption="../report/fig11_broadcast_cpu.rst", category="3 CPU"),
        "results/figures/fig11_broadcast_cpu.md",
        report("results/figures/fig12_cpu_reduction.png", caption="../report/fig12_cpu_reduction.rst", category="3 CPU"),
        "results/figures/fig12_cpu_reduction.pdf",
        report("results/figures/fig12_cpu_reduction.csv", caption="../report/fig12_cpu_reduction.rst", category="3 CPU"),
        "results/figures/fig12_cpu_reduction.md",
        report("results/figures/fig13_core_limit_speedup.png", caption="../report/fig13_core_limit_speedup.rst", category="4 Core limits"),
        "results/figures/fig13_core_limit_speedup.pdf",
        report("results/figures/fig13_core_limit_speedup.csv", caption="../report/fig13_core_limit_speedup.rst", category="4 Core limits"),
        "results/figures/fig13_core_limit_speedup.md",
        report("results/figures/table3_slowdown_1core.csv", caption="../report/table3_slowdown_1core.rst", category="4 Core limits"),
        "results/figures/table3_slowdown_1core.md",
        report("results/figures/table4_idle_power.csv", caption="../report/table4_idle_power.rst", category="5 Energy"),
        "results/figures/table4_idle_power.md",
        report("results/figures/table5_energy.csv", caption="../report/table5_energy.rst", category="5 Energy"),
        "results/figures/table5_energy.md",
        report("results/figures/fig14_power_over_time.png", caption="../report/fig14_power_over_time.rst", category="5 Energy"),
        "results/figures/fig14_power_over_time.pdf",
        report("results/figures/paper_vs_run.csv", caption="../report/paper_vs_run.rst", category="0 Paper vs this run"),
        "results/figures/paper_vs_run.md",
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
