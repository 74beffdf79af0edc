import shlex

CELL_SUMMARY = (
    f"results/runs/{config['network']}/{{scheme}}/n{config['n']}/c{config['cores']}/"
    f"{config['consumer']}/summary.json"
)


wildcard_constraints:
    scheme="baseline|all_shared|single_broadcast|multi_broadcast",


def cell_args(wildcards):
    """Command-line arguments of one cell, quoted for the shell."""
    args = [
        "--network", config["network"], "--batch-size", config["batch_size"],
        "--image-size", config["image_size"], "--consumer", config["consumer"],
        "--steps", config["steps"], "--warmup", config["warmup"], "--cores", config["cores"],
        "--scheme", wildcards.scheme,
    ]
    return " ".join(shlex.quote(str(a)) for a in args)
