rule dataset:
    """The shared data stage: generate the embedded dataset, or stage yours (image class folders
    are converted into shards, every file accounted for; TFRecord shards linked), with a manifest
    every cell checks against."""
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


rule dataset_counts:
    """The dataset's files accounted for (results/tables/dataset.csv, in the report): images
    included, files skipped and ignored by reason."""
    input:
        manifest="results/dataset/manifest.json",
    output:
        table=report("results/tables/dataset.csv", caption="../report/dataset.rst", category="Dataset"),
    conda:
        ENV
    log:
        "results/logs/dataset_counts.log",
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    localrule: True
    script:
        "../scripts/dataset_counts.py"
