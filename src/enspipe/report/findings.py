"""Paper vs this run: each headline finding of the SC'18 paper, its numbers, this run's, the pass
threshold and whether the finding holds here.

Every finding is a registered judge with a stated ``threshold``. A judge answers ``yes``, ``no``,
``partly``, ``not enough data here`` (the grid lacks its cells or repeats: the basis says what to
run) or ``not testable here``: the cells exist, but this machine cannot express what produces the
effect (a core limit equal to the cores a member gets anyway; members sharing one host's cores
where the paper gave each its own node; an emulated accelerator that uses no CPU). Such a finding
says why and is never ``yes``. Two invariants that any honest measurement satisfies are judged
the same way: sharing between n members saves at most n x CPU, and cells of identical work agree.

A finding is judged on its direction and ordering, not on the paper's magnitudes: those came from
16-core Titan nodes, one member per node, 1000 steps and n up to 150.
"""
from __future__ import annotations

import pandas as pd

from enspipe.report.verdicts import (BY_DESIGN, COLUMNS, FINDINGS, NETWORKS, NOT_ENOUGH, NOT_QUIET, NOT_TESTABLE,  # noqa: F401
                                     WITHIN_NOISE, Verdict, verdict)
# the judges register in the table's order: the paper's, then the rest
from enspipe.report.findings_paper import (broadcast_cpu_finding, core_limit_finding, energy_finding,  # noqa: F401
                                           peak_order_finding, queue_finding, reduction_finding, slowdown_finding,
                                           solo_parallel_finding, speedup_finding, utilisation_finding)
from enspipe.report.findings_beyond import (ceiling_finding, fleet_finding, fleet_local_finding,  # noqa: F401
                                            identical_work_finding, lag_finding, peer_finding, planner_finding,
                                            prediction_finding)


def paper_vs_run(df: pd.DataFrame, t: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The findings table from the cell table and the derived tables (keys as in ``figures.render``)."""
    return pd.DataFrame([verdict(f, df, t) for f in FINDINGS], columns=COLUMNS)
