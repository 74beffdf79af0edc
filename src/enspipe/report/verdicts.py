"""The machinery of ``paper_vs_run`` (:mod:`enspipe.report.findings`): a finding's registered
judge, its :class:`Verdict`, the words a verdict may hold besides ``yes`` and ``no``, and the
helpers the judges share.

Two words keep a verdict from flipping with the weather:

* ``within noise`` (:data:`WITHIN_NOISE`): the measured value's margin to its threshold is inside
  the run's own measured spread (:func:`against`); the basis gives both, and the verdict is
  neither yes nor no.
* ``node not quiet`` (:data:`NOT_QUIET`): a cell the verdict rests on ran while its host was busy
  with work outside the cell: the host's CPU outside the cell's processes above
  :data:`OUTSIDE_SHARE` of its cores (:func:`busy_outside`). Where such a judge would answer ``no``
  or ``partly``, it answers this instead, naming the cells and their outside load.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from enspipe.report.collect import ratio_noise, spread

NETWORKS = ["alexnet_v2", "inception_v1", "vgg_a"]
COLUMNS = ["finding", "source", "paper", "this_run", "threshold", "holds", "basis"]
NOT_TESTABLE = "not testable here"
NOT_ENOUGH = "not enough data here"  # the grid lacks the cells or repeats: the basis says what to run
FULL_RUN = "`make run-full` (config/full.yaml) has them"
BY_DESIGN = "differs by design"  # enspipe does it otherwise on purpose; the basis says how and why
IDENTICAL_WORK_SPREAD = 0.15  # n = 1 cells of every scheme do the same work: medians within 15%
CO_RUNNING_TOLERANCE = 0.05  # the same preprocessing per image in two cells: within 5% unless their hosts' load differs
WITHIN_NOISE = "within noise"  # the margin to the threshold is inside the run's measured spread
NOT_QUIET = "node not quiet"   # a judged cell's host was busy with work outside the cell
OUTSIDE_SHARE = 0.25  # a host busy outside a cell: its CPU outside the cell's processes above this share of its cores


@dataclass(frozen=True)
class Verdict:
    """A judge's answer: this run's numbers, whether the finding holds (True, False, a word such
    as ``partly``, or :data:`NOT_TESTABLE`) and on what basis (or why it cannot be tested)."""

    this_run: str
    holds: bool | str
    basis: str = ""
    cells: tuple = ()  # the cells it rests on: a no or partly among busy hosts reads "node not quiet"


def untestable(this_run: str, why: str) -> Verdict:
    return Verdict(this_run, NOT_TESTABLE, why)


@dataclass(frozen=True)
class Finding:
    source: str
    claim: str
    paper: str
    threshold: str
    judge: Callable[[pd.DataFrame, dict], Verdict | None]


FINDINGS: list[Finding] = []  # the registered judges, in the table's order


def finding(source: str, claim: str, paper: str, threshold: str):
    """Register a judge ``(cell table, derived tables) -> Verdict | None`` (None: no data here) of
    the paper's finding ``claim`` (in ``source``, with the paper's numbers ``paper``), passing when
    ``threshold`` is met."""
    def register(judge):
        judge.finding = Finding(source, claim, paper, threshold, judge)
        FINDINGS.append(judge.finding)
        return judge
    return register


def verdict(f, df: pd.DataFrame, t: dict[str, pd.DataFrame]) -> dict:
    """One row of the table: a registered finding (or its judge) and the judge's answer."""
    f = getattr(f, "finding", f)
    v = f.judge(df, t)
    if v is None:
        word, this_run, basis = NOT_ENOUGH, "-", f"no cells for it in this run's grid; {FULL_RUN}"
    else:
        word = v.holds if isinstance(v.holds, str) else ("yes" if v.holds else "no")
        this_run, basis = v.this_run, v.basis
        loud = busy_outside(df[df["cell"].isin(v.cells)]) if v.cells and "cell" in df else df.iloc[0:0]
        if (word in ("no", "partly") or word.startswith("no (")) and len(loud):
            word, basis = NOT_QUIET, f"{basis}; {outside_text(loud)}: its verdict would be '{word}'".lstrip("; ")
    return {"finding": f.claim, "source": f.source, "paper": f.paper, "this_run": this_run,
            "threshold": f.threshold, "holds": word, "basis": basis}


def busy_outside(d: pd.DataFrame) -> pd.DataFrame:
    """The cells of ``d`` whose host was busy with work outside them: node CPU outside the cells'
    processes above :data:`OUTSIDE_SHARE` of the host's cores over the window."""
    if not len(d) or "node_outside_cores" not in d or "host_cpus" not in d:
        return d.iloc[0:0]
    outside = pd.to_numeric(d["node_outside_cores"], errors="coerce")
    return d[outside > OUTSIDE_SHARE * pd.to_numeric(d["host_cpus"], errors="coerce")]


def outside_text(loud: pd.DataFrame) -> str:
    return (f"node not quiet in {len(loud)} cell(s): " + ", ".join(
        f"{r.cell} ({r.node_outside_cores:.2f} of {int(r.host_cpus)} cores busy outside it)" for r in loud.itertuples())
        + f", more than {OUTSIDE_SHARE:.0%} of the host")


def against(value: float, threshold: float, noise: float, at_least: bool = True) -> bool | str:
    """Whether ``value`` is above ``threshold`` (or below it, ``at_least=False``): True or False
    where its relative margin exceeds ``noise`` (the run's measured relative spread), else
    :data:`WITHIN_NOISE`."""
    margin = value / threshold - 1 if threshold else float("inf")
    if noise > 0 and abs(margin) <= noise:
        return WITHIN_NOISE
    return bool(margin > 0 if at_least else margin < 0)


MIN_PAIRS = 3  # interleaved pairs a ratio's verdict rests on, at least


def against_pairs(ratios: list[float], threshold: float, at_least: bool = True) -> bool | str | None:
    """Whether a ratio measured as interleaved pairs (:func:`~enspipe.report.collect.paired_ratios`)
    is above ``threshold`` (below it, ``at_least=False``): True or False where every pair's ratio
    is on that side or every one on the other, else :data:`WITHIN_NOISE` (the threshold lies
    inside the pairs' spread); None for fewer than :data:`MIN_PAIRS` pairs (judge otherwise)."""
    if len(ratios) < MIN_PAIRS:
        return None
    passing = [(r > threshold) if at_least else (r < threshold) for r in ratios]
    return True if all(passing) else (False if not any(passing) else WITHIN_NOISE)


def pairs_text(ratios: list[float]) -> str:
    """A paired ratio as a verdict's basis gives it: median (min-max) over the pairs."""
    s = sorted(ratios)
    return f"{s[len(s) // 2]:.2f}x ({s[0]:.2f}-{s[-1]:.2f}) over {len(s)} interleaved pairs"


def within(value: float, limit: float, noise: float) -> bool | str:
    """A relative spread or error ``value`` against the most it may be, ``limit``: True or False
    where they are further apart than ``noise`` (an absolute difference of fractions), else
    :data:`WITHIN_NOISE`."""
    return WITHIN_NOISE if abs(value - limit) <= noise else bool(value <= limit)


def all_of(answers: list) -> bool | str:
    """Answers of :func:`against` that must all hold: False where one fails, :data:`WITHIN_NOISE`
    where none fails and one is within noise, else True."""
    if any(a is False for a in answers):
        return False
    return WITHIN_NOISE if WITHIN_NOISE in answers else True


def holds_all(answers: list) -> bool | str:
    """Answers of :func:`against` for several items (networks, schemes): ``yes`` where all hold,
    ``no`` where none does and none is within noise, :data:`WITHIN_NOISE` where the rest hold and
    some are within it, else ``partly``."""
    if all(a is True for a in answers):
        return True
    if all(a is False for a in answers):
        return False
    if all(a in (True, WITHIN_NOISE) for a in answers):
        return WITHIN_NOISE
    return "partly"


def rate_noise(df: pd.DataFrame) -> float:
    """The run's measured spread of a peak rate: its repeated peak cells' largest relative distance
    of a repeat from their median images/s per member (0 without repeats)."""
    peak = df[df["consumer"] == "peak"] if len(df) and "consumer" in df else df
    return spread(peak, "images_per_second_per_member")


def noise_text(noise: float, what: str = "images/s") -> str:
    return f"the run's own repeats of one cell differ by up to {noise:.0%} ({what}), a ratio of two cells by " \
           f"up to {ratio_noise(noise):.0%}"


def cells_like(df: pd.DataFrame, rows: pd.DataFrame, keys) -> tuple:
    """The cells of ``df`` that match a row of a derived table ``rows`` on ``keys`` (the cells a
    judge of that table rests on)."""
    keys = [k for k in keys if k in df and k in rows]
    if not len(rows) or not len(df) or "cell" not in df:
        return ()
    want = {tuple(str(v) for v in r) for r in rows[keys].itertuples(index=False)}
    return tuple(c for c, *k in df[["cell", *keys]].itertuples(index=False) if tuple(str(v) for v in k) in want)


# -- helpers -------------------------------------------------------------------------------------
def fmt(values: dict, unit: str = "", digits: int = 2) -> str:
    return ", ".join(f"{k} {v:.{digits}f}{unit}" for k, v in values.items() if pd.notna(v)) or "n/a"


def alexnet_first(d: pd.DataFrame) -> pd.DataFrame:
    """The AlexNet rows where there are any (the paper's single-member and Fig. 11 results are
    AlexNet's: the network whose preprocessing is the bottleneck), else all rows."""
    return d[d["network"] == "alexnet_v2"] if len(d) and (d["network"] == "alexnet_v2").any() else d


def by_network(d: pd.DataFrame, value: str) -> dict:
    """The value per network (paper order), at the largest n and full cores where there is one."""
    out = {}
    for net in NETWORKS + sorted(set(d["network"]) - set(NETWORKS)):
        g = d[d["network"] == net]
        if not len(g):
            continue
        g = g[g["cores"] == "all"] if (g["cores"] == "all").any() else g
        out[net] = float(g[g["n"] == g["n"].max()][value].mean())
    return out


def node_cpu_gaps(df: pd.DataFrame) -> str:
    """What a node-CPU finding says of cells whose CPU monitor missed part of their window ("" if none)."""
    if "node_cpu_missing" not in df or not df["node_cpu_missing"].notna().any():
        return ""
    cells = df.loc[df["node_cpu_missing"].notna(), "cell"]
    return (f"; node CPU missing in {len(cells)} cells ({', '.join(cells)}: their CPU monitor stopped inside the "
            "window), so node-CPU values leave them out and their process CPU counts alone")


def emulated_only(d: pd.DataFrame) -> bool:
    return len(d) > 0 and set(d["accelerator"].dropna().astype(str)) <= {"emulated", "none"}
