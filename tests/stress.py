"""Reruns tests under CPU load, as CI's loaded 2-core machine runs them, and prints each test's
failure rate: ``python tests/stress.py [--repeats K] [--hogs H] [-m EXPR] [pytest args ...]``
(``make test-stress``).

The tests that spawn processes or time something are the ones that pass on a quiet machine and
fail on a busy one: by default those marked ``mpi``, ``slow`` or ``timing``. Each of the K runs is
one pytest session over them, then one over those of them marked ``alone`` (without xdist's
options, as ``make test`` runs them), with H busy loops (``sh -c 'while :; do :; done'``) on the cores the
whole time. The table lists every test that failed at least once (runs, failures, the first
failure's last line) and the slowest; ``--out DIR`` keeps each run's JUnit XML and the table
(``stress.md``). Exit status 1 where any test failed in any run.

Examples::

    make test-stress                                      # the marked tests, 10 times, 2 hogs
    python tests/stress.py --repeats 10 tests/test_serve_hostile.py -m ''   # one file, every test in it
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HOG = ["sh", "-c", "while :; do :; done"]
DEFAULT_MARKS = "mpi or slow or timing"


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=10, help="pytest sessions (default 10)")
    p.add_argument("--hogs", type=int, default=2, help="busy loops beside them (default 2: CI's 2 cores, loaded)")
    p.add_argument("-m", dest="marks", default=DEFAULT_MARKS, help=f"marker expression (default {DEFAULT_MARKS!r}; "
                   "'' for every test selected)")
    p.add_argument("--out", help="folder for each run's JUnit XML and the table (default: a temporary one)")
    return p.parse_known_args(argv)


def run_once(i: int, a, rest: list[str], out: str) -> list[str]:
    """One session: the selected tests, then those of them marked ``alone`` with nothing beside
    them (without xdist's options), as ``make test`` runs them. Returns its JUnit XML files."""
    xmls, t0, tails = [], time.monotonic(), []
    marks = f"({a.marks}) and " if a.marks else ""
    for suffix, part, args in (("", f"{marks}not alone", rest), ("-alone", f"{marks}alone", without_xdist(rest))):
        xml = os.path.join(out, f"run{i:02d}{suffix}.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *args, "-m", part]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tails.append(f"exit {r.returncode}: " + (r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""))
        xmls.append(xml)
    print(f"run {i + 1}/{a.repeats}: {time.monotonic() - t0:.0f} s; " + "; alone: ".join(tails), flush=True)
    return xmls


def without_xdist(args: list[str]) -> list[str]:
    """pytest arguments less pytest-xdist's ``-n N``, ``--numprocesses N`` and ``--dist MODE``."""
    out, skip = [], False
    for x in args:
        if skip:
            skip = False
        elif x in ("-n", "--numprocesses", "--dist"):
            skip = True
        elif not x.startswith(("-n=", "--numprocesses=", "--dist=")) and not (x.startswith("-n") and x[2:].isdigit()):
            out.append(x)
    return out


def outcomes(xml: str):
    """``(test id, outcome, seconds, message)`` for every test case of one JUnit XML file."""
    if not os.path.exists(xml):
        return
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        message = next((c.get("message", "") for c in case if c.tag in ("failure", "error")), "")
        yield name, kind, float(case.get("time", 0)), message.strip().splitlines()[-1] if message.strip() else ""


def table(xmls: list[str], sessions: int) -> tuple[str, bool]:
    runs, failed, seconds, first = collections.Counter(), collections.Counter(), collections.defaultdict(list), {}
    for xml in xmls:
        for name, kind, secs, message in outcomes(xml):
            if kind == "skipped":
                continue
            runs[name] += 1
            seconds[name].append(secs)
            if kind in ("failure", "error"):
                failed[name] += 1
                first.setdefault(name, message[:160])
    lines = [f"{len(runs)} tests, {sessions} runs; {len(failed)} failed at least once", ""]
    if failed:
        lines += ["| test | runs | failed | first failure |", "|---|---|---|---|"]
        lines += [f"| {n} | {runs[n]} | {failed[n]} | {first[n].replace('|', '/')} |" for n, _ in failed.most_common()]
        lines.append("")
    slow = sorted(seconds, key=lambda n: -max(seconds[n]))[:15]
    lines += ["| slowest tests | median s | max s |", "|---|---|---|"]
    lines += [f"| {n} | {sorted(seconds[n])[len(seconds[n]) // 2]:.1f} | {max(seconds[n]):.1f} |" for n in slow]
    return "\n".join(lines) + "\n", bool(failed)


def main(argv=None) -> int:
    a, rest = parse(sys.argv[1:] if argv is None else argv)
    out = a.out or tempfile.mkdtemp(prefix="enspipe-stress-")
    os.makedirs(out, exist_ok=True)
    hogs = [subprocess.Popen(HOG) for _ in range(a.hogs)]
    print(f"{a.repeats} runs of pytest -m {a.marks!r} {' '.join(rest)} beside {a.hogs} busy loops; "
          f"{os.cpu_count()} cores; results in {out}", flush=True)
    try:
        xmls = [x for i in range(a.repeats) for x in run_once(i, a, rest, out)]
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    text, any_failed = table(xmls, a.repeats)
    with open(os.path.join(out, "stress.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
