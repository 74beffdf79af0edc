# Heterogeneous ensembles (FLEET): config heterogeneous, each arm one `enspipe ensemble` run inside
# its allocation: one MPI job whose rounds are communicators split from it (in_job, the default), or
# a job per round (mpiexec locally; srun job steps through the slurm profile).
import json


rule ensemble_dataset:
    """The heterogeneous experiment's own synthetic dataset: a short epoch, a whole number of batches."""
    output:
        manifest=f"{HET_DATA}/manifest.json",
    params:
        enspipe=ENSPIPE,
        out=lambda wildcards, output: os.path.dirname(output.manifest),
        images=lambda wildcards: HET["num_images"],
    conda:
        ENV
    log:
        "results/logs/heterogeneous/dataset.log",
    threads: 1
    localrule: True
    shell:
        "{params.enspipe} make-dataset --out {params.out} --num-images {params.images} --num-classes 10 "
        "--images-per-shard 32 > {log} 2>&1"


rule ensemble_validation:
    """The members' validation set for early stopping (heterogeneous.validation_images, another seed)."""
    output:
        manifest="results/heterogeneous/validation/manifest.json",
    params:
        enspipe=ENSPIPE,
        out=lambda wildcards, output: os.path.dirname(output.manifest),
        images=lambda wildcards: HET["validation_images"],
    conda:
        ENV
    log:
        "results/logs/heterogeneous/validation.log",
    threads: 1
    localrule: True
    shell:
        "{params.enspipe} make-dataset --out {params.out} --num-images {params.images} --num-classes 10 --seed 1 "
        "--images-per-shard 32 > {log} 2>&1"


rule ensemble_spec:
    """The ensemble (config heterogeneous.ensemble) as the file enspipe ensemble reads."""
    output:
        spec="results/heterogeneous/spec.json",
    params:
        spec=lambda wildcards: json.dumps(HET["ensemble"], indent=2),
    conda:
        ENV
    log:
        "results/logs/heterogeneous/spec.log",
    localrule: True
    shell:
        "printf '%s\\n' {params.spec:q} > {output.spec} 2> {log}"


rule ensemble_arm:
    """One arm (default, homogeneous, fleet or fleet_local) of the heterogeneous ensemble (emulated
    accelerators, or members that train their networks for real)."""
    input:
        spec="results/heterogeneous/spec.json",
        manifest=f"{HET_DATA}/manifest.json",
        validation=[f"{HET_VALIDATION}/manifest.json"] if HET_VALIDATION else [],
    output:
        result="results/heterogeneous/{arm}/ensemble.json",
    wildcard_constraints:
        arm="|".join(ARMS),
    params:
        enspipe=ENSPIPE,
        data=lambda wildcards, input: os.path.dirname(input.manifest),
        out=lambda wildcards, output: os.path.dirname(output.result),
        batch=lambda wildcards: HET["batch_size"],
        options=lambda wildcards: "--fresh "  # a job the workflow (re)runs measures from scratch
        + ("--in-job " if HET.get("in_job", True) else "")
        + (f"--validation {HET_VALIDATION} " if HET_VALIDATION else ""),
        run_args=lambda wildcards: f"--network {HET['network']} --image-size {config['image_size']} "
        f"--monitor-interval {config.get('monitor_interval', 1)}",
    conda:
        ENV
    log:
        "results/logs/heterogeneous/{arm}.log",
    threads: exclusive_threads
    resources:
        tasks=lambda wildcards: HET["ensemble"]["accelerators"],
        mpi=config["mpi"]["launcher"],
        mem_mb=lambda wildcards: grid.slurm_request(config, HET["ensemble"]["accelerators"])["mem_mb"],
        runtime=SLURM["runtime"],
        slurm_extra=lambda wildcards: grid.slurm_request(config, HET["ensemble"]["accelerators"])["slurm_extra"],
    shell:
        "{params.enspipe} ensemble --spec {input.spec} --arm {wildcards.arm} --data {params.data} "
        "--out {params.out} --batch-size {params.batch} {params.options}--launcher '{resources.mpi}' -- "
        "{params.run_args} > {log} 2>&1"
