"""Snakemake script: the staged dataset's manifest -> results/tables/dataset.csv (its files accounted for)."""
import os
import sys

sys.path.insert(0, os.path.join(snakemake.scriptdir, "..", "..", "src"))  # noqa: F821
from enspipe.common.atomic import write_csv_atomic
from enspipe.data.manifest import accounting_rows, read_manifest

rows = accounting_rows(read_manifest(os.path.dirname(snakemake.input.manifest)))  # noqa: F821
write_csv_atomic(snakemake.output.table, rows, ("verdict", "reason", "files"))  # noqa: F821
