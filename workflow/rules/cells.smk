rule dataset:
    output:
        manifest="results/dataset/manifest.json",
    params:
        num_images=config["dataset"]["num_images"],
        seed=config["dataset"]["seed"],
    log:
        "results/logs/dataset.log",
    threads: 1
    resources:
        mem_mb=2000,
    shell:
        "enspipe make-dataset --out results/dataset --num-images {params.num_images} "
        "--seed {params.seed} > {log} 2>&1"


rule cell:
    input:
        manifest=rules.dataset.output.manifest,
    output:
        summary=CELL_SUMMARY,
    params:
        args=cell_args,
        n=config["n"],
        outdir=lambda wc, output: output.summary.rsplit("/", 1)[0],
    log:
        f"results/logs/{config['network']}/{{scheme}}.log",
    threads: workflow.cores
    resources:
        mem_mb=4000,
    shell:
        "mpiexec -n {params.n} enspipe run --data results/dataset --out {params.outdir} "
        "{params.args} 2>&1 | tee {log}"
