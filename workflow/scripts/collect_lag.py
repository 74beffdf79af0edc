"""Snakemake script: the lag cells' summaries -> results/tables/lag.csv (one row per member)."""
import os
import sys

sys.path.insert(0, os.path.join(snakemake.scriptdir, "..", "..", "src"))  # noqa: F821
from enspipe.report.collect import lag_rows, write_cells_csv

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    table = lag_rows(list(snakemake.input.summaries))  # noqa: F821
    write_cells_csv(table, snakemake.output.table)  # noqa: F821
    print(f"{len(table)} members -> {snakemake.output.table}", file=log)  # noqa: F821
