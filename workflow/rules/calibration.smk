rule calibrate:
    """One member's preprocessing rate rp for a network and core limit (baseline, n = 1, peak)."""
    input:
        manifest="results/dataset/manifest.json",
    output:
        summary="results/calibration/{network}/c{cores}/summary.json",
    params:
        enspipe=ENSPIPE,
        args=calibration_args,
        out=lambda wildcards, output: os.path.dirname(output.summary),
    conda:
        ENV
    log:
        "results/logs/calibration/{network}/c{cores}.log",
    threads: exclusive_threads  # alone on the machine, like every measurement
    resources:
        cpus_per_task=cores_per_task,
        mem_mb=SLURM["mem_mb_per_task"],
        runtime=SLURM["runtime"],
        slurm_extra=slurm_extra,
    shell:
        "{params.enspipe} run {params.args} --out {params.out} > {log} 2>&1"


rule calibrate_rc:
    """The accelerator's training rate rc where cells train for real (fixed batch, no pipeline)."""
    output:
        rc="results/calibration/{network}/rc.json",
    params:
        enspipe=ENSPIPE,
        args=rc_args,
    conda:
        ENV
    log:
        "results/logs/calibration/{network}/rc.log",
    threads: exclusive_threads
    resources:
        cpus_per_task=SLURM["full_cores"],
        mem_mb=SLURM["mem_mb_per_task"],
        runtime=SLURM["runtime"],
        slurm_extra=slurm_extra,
    shell:
        "{params.enspipe} calibrate-rc {params.args} --out {output.rc} > {log} 2>&1"


rule rates:
    """rp per network and core limit, and the emulated accelerator's rc per network."""
    input:
        **calibration_summaries(),
    output:
        rates="results/calibration/rates.json",
    conda:
        ENV
    log:
        "results/logs/calibration/rates.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    localrule: True
    script:
        "../scripts/rates.py"


rule calibrate_comm:
    """The collectives' latency and bandwidth and the memory copy's, timed on two ranks (on two
    nodes, two ranks each, where cells spread over nodes: the network timed too) and fitted
    (enspipe calibrate-comm): the cost model's collective costs, beside rates.json."""
    output:
        comm=COMM,
    params:
        enspipe=ENSPIPE,
    conda:
        ENV
    log:
        "results/logs/calibration/comm.log",
    threads: exclusive_threads
    resources:
        tasks=COMM_TASKS,
        mpi=config["mpi"]["launcher"],
        cpus_per_task=1,
        mem_mb=grid.slurm_request(config, COMM_TASKS, 2)["mem_mb"],
        runtime=SLURM["runtime"],
        slurm_extra=grid.slurm_request(config, COMM_TASKS, 2)["slurm_extra"],
    shell:
        "{resources.mpi} -n {resources.tasks} {params.enspipe} calibrate-comm --max-mb 16 --repeats 5 "
        "--out {output.comm} > {log} 2>&1"
