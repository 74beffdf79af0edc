"""Snakemake script: a shared MPI job's spec (enspipe run-cells), as common.smk's job_spec made it."""
import json

spec = snakemake.params.spec  # noqa: F821 - set by Snakemake
with open(snakemake.output.spec, "w") as f:  # noqa: F821
    json.dump(spec, f, indent=1)
with open(snakemake.log[0], "w") as f:  # noqa: F821
    f.write(f"{len(spec['cells'])} cells at n = {spec['n']}: " + ", ".join(c["name"] for c in spec["cells"]) + "\n")
