"""Snakemake script: results/tables/cells.csv -> results/figures/."""
import os
import sys

sys.path.insert(0, os.path.join(snakemake.scriptdir, "..", "..", "src"))  # noqa: F821
from enspipe.report.figures import render

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    paths = render(snakemake.input.table, snakemake.input.rates, snakemake.input.idle, "results/figures",  # noqa: F821
                   lag_csv=snakemake.input.lag, comm_json=snakemake.input.comm,  # noqa: F821
                   paper_config=snakemake.input.paper,  # noqa: F821
                   ensemble_jsons=list(snakemake.input.ensembles))  # noqa: F821
    print("\n".join(paths), file=log)
