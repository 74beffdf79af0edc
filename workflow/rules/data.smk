rule dataset:
    """The shared data stage: generate the embedded dataset, or stage yours (JPEG class folders
    are packed into shards, TFRecord shards linked), with a manifest every cell checks against."""
    output:
        manifest="results/dataset/manifest.json",
    params:
        command=dataset_command(),
    conda:
        ENV
    log:
        "results/logs/dataset.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    shell:
        "{params.command} > {log} 2>&1"
