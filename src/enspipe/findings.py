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


def _row(finding, source, paper, this_run=None, holds=None, basis=""):
    """``holds``: None (no data), a bool, or a word of its own (``partly``)."""
    word = "no data" if holds is None else holds if isinstance(holds, str) else ("yes" if holds else "no")
    return {"finding": finding, "source": source, "paper": paper,
            "this_run": this_run if this_run is not None else "-", "holds": word, "basis": basis}


def _alexnet_first(d: pd.DataFrame) -> pd.DataFrame:
    """The AlexNet rows where there are any (the paper's single-member and Fig. 11 results are
    AlexNet's: the network whose preprocessing is the bottleneck), else all rows."""
    return d[d["network"] == "alexnet_v2"] if len(d) and (d["network"] == "alexnet_v2").any() else d


def _basis(df: pd.DataFrame) -> str:
    if df.empty:
        return ""
    parts = sorted(set(df["accelerator"].dropna().astype(str)))
    energy = sorted(set(df["energy_source"].dropna().astype(str))) if "energy_source" in df else []
    return "accelerator " + "/".join(parts) + (f"; power {'/'.join(energy)}" if energy else "")


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


def queue_finding(df):
    solo = _alexnet_first(tables.solo_cells(df, "all"))
    claim = "One member alone is preprocessing-bound: its preprocessing queue stays full, its compute queue empties"
    paper = "preprocessing queue always full; compute queue empties after start-up (AlexNet)"
    if solo.empty:
        return _row(claim, "Fig. 3", paper)
    pre, comp = solo["queue_preprocessing_mean"].mean(), solo["queue_compute_mean"].mean()
    net = solo["network"].iloc[0]
    return _row(claim, "Fig. 3", paper, f"{net}: mean fill preprocessing {pre:.0%}, compute {comp:.0%}",
                pre > comp and comp < 0.25, _basis(solo))


def utilisation_finding(df):
    solo = _alexnet_first(tables.solo_cells(df, "all"))
    claim = "One member alone keeps every core busy"
    paper = "16 cores at 96.0% after start-up (94.3% over the whole run)"
    if solo.empty:
        return _row(claim, "Fig. 4", paper)
    busy = solo.groupby("network")["per_core_busy_mean"].mean().to_dict()
    return _row(claim, "Fig. 4", paper, "measured window, mean over cores: " + _fmt(busy, "%", 1),
                min(busy.values()) >= 80, _basis(solo))


def core_limit_finding(t2):
    claim = "Under a core limit only the allowed cores are busy"
    paper = "3-core limit: allowed cores 94.0-96.4%, the other 13 at most 0.6%"
    t2 = _alexnet_first(t2)
    if t2.empty:
        return _row(claim, "Table 2", paper)
    on, off = t2[t2["allowed"]]["busy_percent"], t2[~t2["allowed"]]["busy_percent"]
    net = t2["network"].iloc[0]
    span = f"{on.min():.1f}%" if on.min() == on.max() else f"{on.min():.1f}-{on.max():.1f}%"
    text = f"{net}, {t2['core_limit'].iloc[0]}-core limit: allowed cores {span}, " + \
        (f"others at most {off.max():.1f}%" if len(off) else "no other cores on this machine")
    return _row(claim, "Table 2", paper, text, on.min() >= 80 and (off.max() <= 10 if len(off) else True),
                "measured (mpstat)")


def solo_parallel_finding(t1):
    claim = "Running the members in parallel does not slow them down"
    paper = "solo 1132.3 s (std 1.4) vs 1000 nodes in parallel 1132.2 s (std 2.0), one member per node"
    if t1.empty:
        return _row(claim, "Table 1", paper)
    parts, ok = [], []
    for (net, cores), g in t1.groupby(["network", "cores"]):
        solo, par = g[g["n"] == 1].iloc[0], g[g["n"] > 1].iloc[0]
        ratio = par["avg"] / solo["avg"]
        ok.append(bool(ratio <= 1.10))
        parts.append(f"{net} cores {cores}: solo {solo['avg']:.2f} s, {par['run']} on {par['hosts']} host(s) "
                     f"{par['avg']:.2f} s ({ratio:.2f}x)")
    holds = all(ok) or ("partly" if any(ok) else False)
    return _row(claim, "Table 1", paper, "; ".join(parts), holds, "members share one node here" if
                t1["hosts"].max() == 1 else "")


def peak_order_finding(df):
    claim = "Peak preprocessing throughput: All-Shared highest, above Single- and Multi-Broadcast"
    paper = "AS stays at its rate up to n=150; SB and MB fall below AlexNet's rc as n grows (P=5, 20)"
    d = df[(df["consumer"] == "peak") & (df["cores"] == "all")]
    if d.empty or not (d["scheme"] == "all_shared").any():
        return _row(claim, "Fig. 10a", paper)
    n = d[d["scheme"] == "all_shared"]["n"].max()
    at = d[d["n"] == n].groupby(["scheme", "p"])["images_per_second_per_member"].mean()
    rates = {tables.scheme_label(s, p): v for (s, p), v in at.items()}
    best = max(rates, key=rates.get)
    return _row(claim, "Fig. 10a", paper, f"n={n}, images/s per member: " + _fmt(rates, "", 0),
                best == "all_shared", _basis(d))


def broadcast_cpu_finding(t11):
    claim = "Single-Broadcast uses marginally more CPU than All-Shared, Multi-Broadcast far more"
    paper = "AlexNet, n=10..50, normalised to AS: SB slightly above 1, MB far above"
    d = _alexnet_first(t11[t11["n"] > 1] if len(t11) else t11)
    if d.empty:
        return _row(claim, "Fig. 11", paper)
    rel = d.groupby("scheme")["relative_to_all_shared"].mean().to_dict()
    sb, mb = rel.get("single_broadcast"), rel.get("multi_broadcast")
    holds = None if sb is None or mb is None else (sb >= 0.95 and mb >= 1.10 and mb > sb)
    return _row(claim, "Fig. 11", paper, f"{d['network'].iloc[0]}, n > 1, mean over cells: " + _fmt(rel, "x"), holds,
                "node CPU-s per delivered image")


def reduction_finding(t12):
    claim = "All-Shared's CPU reduction is ordered AlexNet > Inception > VGG (inverse to the compute demand)"
    paper = "up to 10.8x, 3.5x, 2.4x"
    if t12.empty:
        return _row(claim, "Fig. 12", paper)
    red = _by_network(t12, "reduction")
    vals = [red[n] for n in NETWORKS if n in red]
    holds = all(a >= b for a, b in zip(vals, vals[1:])) if len(vals) > 1 else None
    return _row(claim, "Fig. 12", paper, f"n={t12['n'].max()}: " + _fmt(red, "x"), holds)


def slowdown_finding(t3):
    claim = "At 1 core the baseline slows down far more than All-Shared"
    paper = "baseline 9.61x / 3.49x / 1.83x, All-Shared 1.54x / 1.06x / 1.02x (AlexNet / Inception / VGG)"
    ens = t3[t3["n"] > 1] if len(t3) else t3
    ens = ens[ens["n"] == ens.groupby("network")["n"].transform("max")] if len(ens) else ens
    if ens.empty:
        return _row(claim, "Table 3", paper)
    piv = ens.groupby(["network", "scheme"])["slowdown"].mean().unstack()
    if not {"baseline", "all_shared"} <= set(piv.columns):
        return _row(claim, "Table 3", paper)
    piv = piv.dropna(subset=["baseline", "all_shared"])
    n = int(ens["n"].max())
    text = f"ensembles (n={n}): " + "; ".join(f"{net}: baseline {r['baseline']:.2f}x, AS {r['all_shared']:.2f}x"
                                             for net, r in piv.iterrows())
    solo = t3[(t3["n"] == 1) & (t3["scheme"] == "baseline")]
    if len(solo):
        text += "; one member alone: " + ", ".join(f"{r['network']} {r['slowdown']:.2f}x" for _, r in solo.iterrows())
    holds = bool((piv["all_shared"] <= piv["baseline"] * 1.05).all() and (piv["all_shared"] < piv["baseline"]).any())
    return _row(claim, "Table 3", paper, text, holds)


def speedup_finding(t13):
    claim = "Under a 1-core limit All-Shared trains faster than the baseline, most for AlexNet"
    paper = "up to 10x for AlexNet at 1 core (n=100)"
    one = t13[t13["cores"] == "1"] if len(t13) else t13
    if one.empty:
        return _row(claim, "Fig. 13", paper)
    sp = _by_network(one, "speedup")
    if "alexnet_v2" in sp:
        holds = max(sp, key=sp.get) == "alexnet_v2" and sp["alexnet_v2"] > 1
    else:
        holds = min(sp.values()) >= 1
    return _row(claim, "Fig. 13", paper, "1 core: " + _fmt(sp, "x"), holds)


def energy_finding(t5):
    claim = "All-Shared draws less power above idle than the baseline"
    paper = "savings 15.8% / 10.0% / 4.5% (AlexNet / Inception / VGG), metered cabinet"
    shared = t5[t5["scheme"] == "all_shared"].dropna(subset=["savings_power_percent"]) if len(t5) else t5
    if shared.empty:
        return _row(claim, "Table 5", paper)
    sav = dict(zip(shared["network"], shared["savings_power_percent"]))
    per_image = dict(zip(shared["network"], shared["savings_energy_percent"]))
    text = "power above idle: " + _fmt(sav, "%", 1) + "; energy above idle per image: " + _fmt(per_image, "%", 1)
    return _row(claim, "Table 5", paper, text, min(sav.values()) > 0,
                "power " + "/".join(sorted(set(shared["energy_source"]))))


def paper_vs_run(df: pd.DataFrame, t: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The findings table from the cell table and the derived tables (keys as in ``figures.render``)."""
    rows = [queue_finding(df), utilisation_finding(df), core_limit_finding(t["table2"]),
            solo_parallel_finding(t["table1"]), peak_order_finding(df), broadcast_cpu_finding(t["fig11"]),
            reduction_finding(t["fig12"]), slowdown_finding(t["table3"]), speedup_finding(t["fig13"]),
            energy_finding(t["table5"])]
    return pd.DataFrame(rows, columns=COLUMNS)
