rule idle_power:
    """The node's idle power (measured where a meter or counter exists, else the model's)."""
    output:
        idle="results/idle/power.json",
    params:
        enspipe=ENSPIPE,
        args=idle_args(),
    conda:
        ENV
    log:
        "results/logs/idle_power.log",
    threads: exclusive_threads  # the node must be idle
    resources:
        mem_mb=1000,
        runtime=10,
        slurm_extra=slurm_extra,
    shell:
        "{params.enspipe} idle-power --out {output.idle} {params.args} > {log} 2>&1"
