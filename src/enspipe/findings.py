"""Paper vs this run: each headline finding of the SC'18 paper, its numbers, this run's, and
whether the finding holds here (``yes``, ``no``, or ``no data`` where the grid has no cells for it).

A finding is judged on its direction and ordering, not on the paper's magnitudes: those came from
16-core Titan nodes, one member per node, 1000 steps and n up to 150.
"""
from __future__ import annotations

import pandas as pd

from enspipe import tables

NETWORKS = ["alexnet_v2", "inception_v1", "vgg_a"]
COLUMNS = ["finding", "source", "paper", "this_run", "holds", "basis"]


def _fmt(values: dict, unit: str = "", digits: int = 2) -> str:
    return ", ".join(f"{k} {v:.{digits}f}{unit}" for k, v in values.items())


FINDINGS: list = []  # the registered judges, in the table's order


def finding(source: str, claim: str, paper: str):
    """Register a judge ``(df, tables) -> (this run, holds, basis) | None`` (None: no data here)
    of the paper's finding ``claim`` (in ``source``, with the paper's numbers ``paper``).
    ``holds`` is a bool or a word of its own (``partly``)."""
    def register(judge):
        judge.finding = (source, claim, paper)
        FINDINGS.append(judge)
        return judge
    return register


def verdict(judge, df: pd.DataFrame, t: dict[str, pd.DataFrame]) -> dict:
    """One row of the table: a registered judge's finding and its result."""
    source, claim, paper = judge.finding
    this_run, holds, basis = judge(df, t) or (None, None, "")
    word = "no data" if holds is None else holds if isinstance(holds, str) else ("yes" if holds else "no")
    return {"finding": claim, "source": source, "paper": paper,
            "this_run": this_run if this_run is not None else "-", "holds": word, "basis": basis}


def _alexnet_first(d: pd.DataFrame) -> pd.DataFrame:
    """The AlexNet rows where there are any (the paper's single-member and Fig. 11 results are
    AlexNet's: the network whose preprocessing is the bottleneck), else all rows."""
    return d[d["network"] == "alexnet_v2"] if len(d) and (d["network"] == "alexnet_v2").any() else d


def _by_network(d: pd.DataFrame, value: str) -> dict:
    """The value per network (paper order), at the largest n and full cores where there is one."""
    out = {}
    for net in NETWORKS + sorted(set(d["network"]) - set(NETWORKS)):
        g = d[d["network"] == net]
        if not len(g):
            continue
        g = g[g["cores"] == "all"] if (g["cores"] == "all").any() else g
        out[net] = float(g[g["n"] == g["n"].max()][value].mean())
    return out


@finding("Fig. 3", "One member alone is preprocessing-bound: its preprocessing queue stays full, its compute queue "
                  "empties", "preprocessing queue always full; compute queue empties after start-up (AlexNet)")
def queue_finding(df, t):
    solo = _alexnet_first(tables.solo_cells(df, "all"))
    if solo.empty:
        return None
    pre, comp = solo["queue_preprocessing_mean"].mean(), solo["queue_compute_mean"].mean()
    return (f"{solo['network'].iloc[0]}: mean fill preprocessing {pre:.0%}, compute {comp:.0%}",
            pre > comp and comp < 0.25, tables.provenance(solo, machine=False))


@finding("Fig. 4", "One member alone keeps every core busy", "16 cores at 96.0% after start-up (94.3% over the whole run)")
def utilisation_finding(df, t):
    solo = _alexnet_first(tables.solo_cells(df, "all"))
    if solo.empty:
        return None
    busy = solo.groupby("network")["per_core_busy_mean"].mean().to_dict()
    return "measured window, mean over cores: " + _fmt(busy, "%", 1), min(busy.values()) >= 80, tables.provenance(solo, machine=False)


@finding("Table 2", "Under a core limit only the allowed cores are busy",
         "3-core limit: allowed cores 94.0-96.4%, the other 13 at most 0.6%")
def core_limit_finding(df, t):
    t2 = _alexnet_first(t["table2"])
    if t2.empty:
        return None
    on, off = t2[t2["allowed"]]["busy_percent"], t2[~t2["allowed"]]["busy_percent"]
    net = t2["network"].iloc[0]
    span = f"{on.min():.1f}%" if on.min() == on.max() else f"{on.min():.1f}-{on.max():.1f}%"
    text = f"{net}, {t2['core_limit'].iloc[0]}-core limit: allowed cores {span}, " + \
        (f"others at most {off.max():.1f}%" if len(off) else "no other cores on this machine")
    return text, on.min() >= 80 and (off.max() <= 10 if len(off) else True), "measured (mpstat)"


@finding("Table 1", "Running the members in parallel does not slow them down",
         "solo 1132.3 s (std 1.4) vs 1000 nodes in parallel 1132.2 s (std 2.0), one member per node")
def solo_parallel_finding(df, t):
    t1 = t["table1"]
    if t1.empty:
        return None
    parts, ok = [], []
    for (net, cores), g in t1.groupby(["network", "cores"]):
        solo, par = g[g["n"] == 1].iloc[0], g[g["n"] > 1].iloc[0]
        ratio = par["avg"] / solo["avg"]
        ok.append(bool(ratio <= 1.10))
        parts.append(f"{net} cores {cores}: solo {solo['avg']:.2f} s, {par['run']} on {par['hosts']} host(s) "
                     f"{par['avg']:.2f} s ({ratio:.2f}x)")
    holds = all(ok) or ("partly" if any(ok) else False)
    return "; ".join(parts), holds, "members share one node here" if t1["hosts"].max() == 1 else ""


@finding("Fig. 10a", "Peak preprocessing throughput: All-Shared highest, above Single- and Multi-Broadcast",
         "AS stays at its rate up to n=150; SB and MB fall below AlexNet's rc as n grows (P=5, 20)")
def peak_order_finding(df, t):
    d = df[(df["consumer"] == "peak") & (df["cores"] == "all")]
    if d.empty or not (d["scheme"] == "all_shared").any():
        return None
    n = d[d["scheme"] == "all_shared"]["n"].max()
    at = d[d["n"] == n].groupby(["scheme", "p"])["images_per_second_per_member"].mean()
    rates = {tables.scheme_label(s, p): v for (s, p), v in at.items()}
    return f"n={n}, images/s per member: " + _fmt(rates, "", 0), max(rates, key=rates.get) == "all_shared", tables.provenance(d, machine=False)


@finding("Fig. 11", "Single-Broadcast uses marginally more CPU than All-Shared, Multi-Broadcast far more",
         "AlexNet, n=10..50, normalised to AS: SB slightly above 1, MB far above")
def broadcast_cpu_finding(df, t):
    t11 = t["fig11"]
    d = _alexnet_first(t11[t11["n"] > 1] if len(t11) else t11)
    if d.empty:
        return None
    rel = d.groupby("scheme")["relative_to_all_shared"].mean().to_dict()
    sb, mb = rel.get("single_broadcast"), rel.get("multi_broadcast")
    holds = None if sb is None or mb is None else (sb >= 0.95 and mb >= 1.10 and mb > sb)
    return (f"{d['network'].iloc[0]}, n > 1, mean over cells: " + _fmt(rel, "x"), holds,
            "node CPU-s per delivered image")


@finding("Fig. 12", "All-Shared's CPU reduction is ordered AlexNet > Inception > VGG (inverse to the compute demand)",
         "up to 10.8x, 3.5x, 2.4x")
def reduction_finding(df, t):
    t12 = t["fig12"]
    if t12.empty:
        return None
    red = _by_network(t12, "reduction")
    vals = [red[n] for n in NETWORKS if n in red]
    holds = all(a >= b for a, b in zip(vals, vals[1:])) if len(vals) > 1 else None
    return f"n={t12['n'].max()}: " + _fmt(red, "x"), holds, ""


@finding("Table 3", "At 1 core the baseline slows down far more than All-Shared",
         "baseline 9.61x / 3.49x / 1.83x, All-Shared 1.54x / 1.06x / 1.02x (AlexNet / Inception / VGG)")
def slowdown_finding(df, t):
    t3 = t["table3"]
    ens = t3[t3["n"] > 1] if len(t3) else t3
    ens = ens[ens["n"] == ens.groupby("network")["n"].transform("max")] if len(ens) else ens
    if ens.empty:
        return None
    piv = ens.groupby(["network", "scheme"])["slowdown"].mean().unstack()
    if not {"baseline", "all_shared"} <= set(piv.columns):
        return None
    piv = piv.dropna(subset=["baseline", "all_shared"])
    n = int(ens["n"].max())
    text = f"ensembles (n={n}): " + "; ".join(f"{net}: baseline {r['baseline']:.2f}x, AS {r['all_shared']:.2f}x"
                                             for net, r in piv.iterrows())
    solo = t3[(t3["n"] == 1) & (t3["scheme"] == "baseline")]
    if len(solo):
        text += "; one member alone: " + ", ".join(f"{r['network']} {r['slowdown']:.2f}x" for _, r in solo.iterrows())
    holds = bool((piv["all_shared"] <= piv["baseline"] * 1.05).all() and (piv["all_shared"] < piv["baseline"]).any())
    return text, holds, ""


@finding("Fig. 13", "Under a 1-core limit All-Shared trains faster than the baseline, most for AlexNet",
         "up to 10x for AlexNet at 1 core (n=100)")
def speedup_finding(df, t):
    t13 = t["fig13"]
    one = t13[t13["cores"] == "1"] if len(t13) else t13
    if one.empty:
        return None
    sp = _by_network(one, "speedup")
    if "alexnet_v2" in sp:
        holds = max(sp, key=sp.get) == "alexnet_v2" and sp["alexnet_v2"] > 1
    else:
        holds = min(sp.values()) >= 1
    return "1 core: " + _fmt(sp, "x"), holds, ""


@finding("Table 5", "All-Shared draws less power above idle than the baseline",
         "savings 15.8% / 10.0% / 4.5% (AlexNet / Inception / VGG), metered cabinet")
def energy_finding(df, t):
    t5 = t["table5"]
    shared = t5[t5["scheme"] == "all_shared"].dropna(subset=["savings_power_percent"]) if len(t5) else t5
    if shared.empty:
        return None
    sav = dict(zip(shared["network"], shared["savings_power_percent"]))
    per_image = dict(zip(shared["network"], shared["savings_energy_percent"]))
    text = "power above idle: " + _fmt(sav, "%", 1) + "; energy above idle per image: " + _fmt(per_image, "%", 1)
    return text, min(sav.values()) > 0, "power " + "/".join(sorted(set(shared["energy_source"])))


def paper_vs_run(df: pd.DataFrame, t: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The findings table from the cell table and the derived tables (keys as in ``figures.render``)."""
    return pd.DataFrame([verdict(judge, df, t) for judge in FINDINGS], columns=COLUMNS)
