"""Snakemake script: the calibration runs -> results/calibration/rates.json."""
import json
import os
import sys

sys.path.insert(0, os.path.join(snakemake.scriptdir, "..", "..", "src"))  # noqa: F821
from enspipe.run.calibration import rates
from enspipe.common.atomic import write_json_atomic

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    inputs = dict(snakemake.input.items())  # noqa: F821
    measured = {k[len("rc__"):]: v for k, v in inputs.items() if k.startswith("rc__")}
    summaries = {tuple(k.split("__c")): v for k, v in inputs.items() if not k.startswith("rc__")}
    out = rates(snakemake.config, summaries, measured)  # noqa: F821
    write_json_atomic(snakemake.output.rates, out)  # noqa: F821
    print(json.dumps(out, indent=1), file=log)
