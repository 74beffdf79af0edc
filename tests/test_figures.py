"""Figures and tables from a small fixture table: values, orderings, labels and placeholders."""
import pandas as pd
import pytest

from enspipe import figures
from enspipe.collect import COLUMNS


def _row(**kw):
    row = dict.fromkeys(COLUMNS)
    row.update(accelerator="emulated", energy_source="modelled", machine="CPU X (2 CPUs), no GPU", p=kw.get("n", 1))
    row.update(kw)
    return row


@pytest.fixture
def table(tmp_path):
    rows = [
        _row(network="vgg_a", scheme="baseline", n=2, cores="all", consumer="emulated", node_cpu_seconds_per_image=0.004,
             images_per_second_per_member=60.0),
        _row(network="vgg_a", scheme="all_shared", n=2, cores="all", consumer="emulated", node_cpu_seconds_per_image=0.002,
             images_per_second_per_member=61.0),
        _row(network="vgg_a", scheme="baseline", n=2, cores="1", consumer="emulated", node_cpu_seconds_per_image=0.005,
             images_per_second_per_member=20.0),
        _row(network="vgg_a", scheme="all_shared", n=2, cores="1", consumer="emulated", node_cpu_seconds_per_image=0.002,
             images_per_second_per_member=55.0),
        _row(network="vgg_a", scheme="all_shared", n=4, cores="all", consumer="peak", accelerator="none",
             images_per_second_per_member=400.0),
        _row(network="vgg_a", scheme="baseline", n=4, cores="all", consumer="peak", accelerator="none",
             images_per_second_per_member=100.0),
    ]
    path = tmp_path / "cells.csv"
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(path, index=False)
    return path


def test_cpu_reduction_and_slowdown_values(table):
    df = pd.read_csv(table, dtype={"cores": str})
    red = figures.cpu_reduction(df).set_index("cores")
    assert red.loc["all", "reduction"] == pytest.approx(2.0) and red.loc["1", "reduction"] == pytest.approx(2.5)
    slow = figures.slowdown_at_one_core(df).set_index("scheme")
    assert slow.loc["baseline", "slowdown"] == pytest.approx(3.0)
    assert slow.loc["all_shared", "slowdown"] == pytest.approx(61 / 55)
    assert slow.loc["baseline", "slowdown"] > slow.loc["all_shared", "slowdown"]  # the paper's finding


def test_render_writes_every_output_with_its_provenance(table, tmp_path):
    out = tmp_path / "figs"
    stems = figures.render(str(table), None, str(out))
    for stem in stems:
        assert (out / f"{stem.rsplit('/', 1)[1]}.png").exists() or (out / f"{stem.rsplit('/', 1)[1]}.csv").exists()
    assert (out / "fig10_peak_throughput.png").stat().st_size > 1000 and (out / "fig10_peak_throughput.pdf").exists()
    md = (out / "fig12_cpu_reduction.md").read_text()
    assert "accelerator: emulated" in md and "energy: modelled" in md and "CPU X (2 CPUs)" in md
    assert "| vgg_a | 2 | 1 |" in md


def test_missing_data_says_so_instead_of_failing(tmp_path):
    path = tmp_path / "cells.csv"
    pd.DataFrame([_row(network="vgg_a", scheme="baseline", n=1, cores="all", consumer="peak",
                       images_per_second_per_member=10.0)], columns=list(COLUMNS)).to_csv(path, index=False)
    figures.render(str(path), None, str(tmp_path / "f"))
    assert "No data" in (tmp_path / "f" / "table3_slowdown_1core.md").read_text()
    assert (tmp_path / "f" / "fig12_cpu_reduction.png").exists()
