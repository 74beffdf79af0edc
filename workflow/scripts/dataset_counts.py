"""Snakemake script: the staged dataset's manifest -> results/tables/dataset.csv (its files accounted for)."""
import os
import sys

sys.path.insert(0, os.path.join(snakemake.scriptdir, "..", "..", "src"))  # noqa: F821
from enspipe.common.atomic import write_csv_atomic
from enspipe.data.manifest import accounting_rows, read_manifest

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    rows = accounting_rows(read_manifest(os.path.dirname(snakemake.input.manifest)))  # noqa: F821
    write_csv_atomic(snakemake.output.table, rows, ("verdict", "reason", "files"))  # noqa: F821
    print(f"{sum(r['files'] for r in rows)} files accounted for -> {snakemake.output.table}", file=log)  # noqa: F821
