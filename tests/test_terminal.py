"""What `make run` prints at its end: the report's place, every finding's verdict, the headline ratios."""
import pandas as pd

from conftest import enspipe
from enspipe.report.terminal import summary_lines


def test_the_summary_lists_every_verdict_and_the_headline_ratios(tmp_path):
    figures = tmp_path / "figures"
    figures.mkdir()
    pd.DataFrame([{"finding": "All-Shared's CPU reduction is ordered", "source": "Fig. 12", "holds": "yes"},
                  {"finding": "Multi-Broadcast far costlier", "source": "Fig. 11", "holds": "differs by design"}]
                 ).to_csv(figures / "paper_vs_run.csv", index=False)
    pd.DataFrame([{"network": "alexnet_v2", "n": n, "cores": "1", "reduction": r} for n, r in ((2, 1.91), (4, 3.55),
                                                                                              (8, 6.0))]
                 ).to_csv(figures / "fig12_cpu_reduction.csv", index=False)
    pd.DataFrame([{"arm": "default", "makespan_over_fleet": 1.4, "accelerator": "emulated"},
                  {"arm": "fleet", "makespan_over_fleet": 1.0, "accelerator": "emulated"}]
                 ).to_csv(figures / "heterogeneous_arms.csv", index=False)
    text = "\n".join(summary_lines(str(tmp_path)))
    assert str(tmp_path / "report.html") in text
    assert "Fig. 11" in text and "differs by design" in text and "Fig. 12" in text
    assert "alexnet_v2 n=2 cores 1: 1.91x" in text and "n=4 cores 1: 3.55x" in text and "n=8" not in text
    assert "over default 1.40x" in text and "emulated" in text


def test_a_run_without_tables_says_so(tmp_path):
    (tmp_path / "figures").mkdir()
    text = "\n".join(summary_lines(str(tmp_path)))
    assert "no paper_vs_run table" in text and "no data at n = 2 or 4" in text
    r = enspipe("summarize", "--results", tmp_path / "nothing")
    assert r.returncode == 2 and "--results" in r.stderr
