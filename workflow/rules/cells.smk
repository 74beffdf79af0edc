# One MPI job per cell, or (config cells_per_job > 1) one per group of cells of one n and core limit,
# run one after another in it (enspipe run-cells; each cell's rule then takes its folder, and runs
# the cell alone where it failed there). Locally each job takes every core, so measurements run one
# at a time. n = 1 runs without a launcher (a singleton MPI job), n > 1 under resources.mpi:
# mpiexec locally, srun through the slurm profile (the Slurm executor rejects tasks = 1 with mpi).


rule cell_job_spec:
    input:
        unpack(job_inputs),
    output:
        spec="results/jobs/{job}/spec.json",
    params:
        spec=job_spec,
    log:
        "results/logs/jobs/{job}.spec.log",
    localrule: True
    conda:
        ENV
    script:
        "../scripts/job_spec.py"


rule cell_job_single:
    input:
        spec="results/jobs/{job}/spec.json",
    output:
        done="results/jobs/{job}/done.json",
    wildcard_constraints:
        job=r"n1_c.*",
    params:
        enspipe=ENSPIPE,
    conda:
        ENV
    log:
        "results/logs/jobs/{job}.log",
    threads: lambda wildcards: exclusive_threads(job_cell(wildcards))
    resources:
        cpus_per_task=lambda wildcards: cores_per_task(job_cell(wildcards)),
        mem_mb=SLURM["mem_mb_per_task"],
        runtime=SLURM["runtime"],
        slurm_extra=slurm_extra,
    shell:
        "{params.enspipe} run-cells {input.spec} > {log} 2>&1 && rc=0 || rc=$?; "
        "echo '{{\"exit\": '$rc'}}' > {output.done}"


rule cell_job_mpi:
    input:
        spec="results/jobs/{job}/spec.json",
    output:
        done="results/jobs/{job}/done.json",
    wildcard_constraints:
        job=r"n([2-9]|[1-9][0-9]+)_c.*",
    params:
        enspipe=ENSPIPE,
    conda:
        ENV
    log:
        "results/logs/jobs/{job}.log",
    threads: lambda wildcards: exclusive_threads(job_cell(wildcards))
    resources:
        tasks=lambda wildcards: JOBS[wildcards.job][0].n,
        mpi=config["mpi"]["launcher"],
        cpus_per_task=lambda wildcards: cores_per_task(job_cell(wildcards)),
        mem_mb=lambda wildcards: cell_slurm(job_cell(wildcards))["mem_mb"],
        runtime=SLURM["runtime"],
        slurm_extra=lambda wildcards: cell_slurm(job_cell(wildcards))["slurm_extra"],
    shell:
        "{params.enspipe} run-cells {input.spec} --launcher '{resources.mpi} -n {resources.tasks}' > {log} 2>&1 "
        "&& rc=0 || rc=$?; echo '{{\"exit\": '$rc'}}' > {output.done}"


rule cell_single:
    input:
        unpack(cell_inputs),
    output:
        summary="results/runs/{network}/{scheme}/n1_p{p}/c{cores}/{consumer}/rep{rep}/summary.json",
    params:
        enspipe=ENSPIPE,
        args=lambda wildcards, input: cell_args(wildcards, input, n=1),
        out=lambda wildcards, output: os.path.dirname(output.summary),
        take=lambda wildcards, output: take_first(wildcards, output, n=1),
    conda:
        ENV
    log:
        "results/logs/runs/{network}/{scheme}/n1_p{p}/c{cores}/{consumer}/rep{rep}.log",
    threads: exclusive_threads
    resources:
        cpus_per_task=cores_per_task,
        mem_mb=SLURM["mem_mb_per_task"],
        runtime=SLURM["runtime"],
        slurm_extra=slurm_extra,
    shell:
        "({params.take}{params.enspipe} run {params.args} --out {params.out}) > {log} 2>&1"


rule cell_mpi:
    input:
        unpack(cell_inputs),
    output:
        summary="results/runs/{network}/{scheme}/n{n}_p{p}/c{cores}/{consumer}/rep{rep}/summary.json",
    wildcard_constraints:
        n=r"[2-9]|[1-9][0-9]+",
    params:
        enspipe=ENSPIPE,
        args=cell_args,
        out=lambda wildcards, output: os.path.dirname(output.summary),
        take=take_first,
    conda:
        ENV
    log:
        "results/logs/runs/{network}/{scheme}/n{n}_p{p}/c{cores}/{consumer}/rep{rep}.log",
    threads: exclusive_threads
    resources:
        tasks=lambda wildcards: int(wildcards.n),
        mpi=config["mpi"]["launcher"],
        cpus_per_task=cores_per_task,
        mem_mb=lambda wildcards: cell_slurm(wildcards)["mem_mb"],
        runtime=SLURM["runtime"],
        slurm_extra=lambda wildcards: cell_slurm(wildcards)["slurm_extra"],
    shell:
        "({params.take}{resources.mpi} -n {resources.tasks} {params.enspipe} run {params.args} --out {params.out}) "
        "> {log} 2>&1"


rule lag_cell:
    """One member's accelerator slowed (config lag): enspipe's lockstep against the tf.data
    service's run-ahead-and-skip, one cell per scheme."""
    input:
        manifest=f"{DATASET}/manifest.json",
        idle=IDLE,
        rates=RATES,
    output:
        summary="results/lag/{scheme}/summary.json",
    params:
        enspipe=ENSPIPE,
        args=lag_args,
        out=lambda wildcards, output: os.path.dirname(output.summary),
    conda:
        ENV
    log:
        "results/logs/lag/{scheme}.log",
    threads: exclusive_threads
    resources:
        tasks=lambda wildcards: LAG_CELLS[wildcards.scheme].n,
        mpi=config["mpi"]["launcher"],
        cpus_per_task=lambda wildcards: cores_per_task(LAG_CELLS[wildcards.scheme]),
        mem_mb=lambda wildcards: grid.slurm_request(config, LAG_CELLS[wildcards.scheme].n)["mem_mb"],
        runtime=SLURM["runtime"],
        slurm_extra=lambda wildcards: grid.slurm_request(config, LAG_CELLS[wildcards.scheme].n)["slurm_extra"],
    shell:
        "{resources.mpi} -n {resources.tasks} {params.enspipe} run {params.args} --out {params.out} > {log} 2>&1"
