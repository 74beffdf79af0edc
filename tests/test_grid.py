"""The experiment grid, its schema, calibration rates and the tidy table (no MPI)."""
import json
import os

import jsonschema
import pytest
import yaml

from enspipe.run import grid
from enspipe.run.calibration import rates
from enspipe.report.collect import ROW_COLUMNS, add_reductions, cell_row

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(name):
    with open(os.path.join(ROOT, "config", f"{name}.yaml")) as f:
        return yaml.safe_load(f)


def _schema():
    with open(os.path.join(ROOT, "workflow", "schemas", "config.schema.yaml")) as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize("name", ["config", "test", "paper"])
def test_shipped_configs_are_valid(name):
    jsonschema.validate(_config(name), _schema())


@pytest.mark.parametrize("change, where", [
    ({"steps": 0}, "steps"),
    ({"experiments": {"x": {"consumer": "gpu", "networks": ["vgg_a"], "schemes": ["baseline"], "n": [1]}}}, "consumer"),
    ({"networks": {"resnet": {"batch_size": 8}}}, "resnet"),
    ({"image_size": 8}, "image_size"),
    ({"bogus": 1}, "bogus"),
])
def test_schema_errors_name_the_key(change, where):
    with pytest.raises(jsonschema.ValidationError) as e:
        jsonschema.validate(_config("test") | change, _schema())
    assert where in str(e.value)


def test_only_valid_cells_are_generated():
    cfg = {"networks": {"vgg_a": {"batch_size": 2}}, "repeats": 2,
           "experiments": {"e": {"consumer": "peak", "networks": ["vgg_a"],
                                 "schemes": ["baseline", "all_shared", "single_broadcast", "multi_broadcast"],
                                 "n": [1, 3], "p": [1, 2, 3], "cores": [1, "all"]}}}
    cells = grid.cells(cfg)
    keys = {(c.scheme, c.n, c.p) for c in cells}
    # SB needs P < N; MB P <= N; the all-shared batch of 2 cannot be split 3 ways; P = 3 neither
    assert keys == {("baseline", 1, 1), ("baseline", 3, 3), ("all_shared", 1, 1), ("single_broadcast", 3, 1),
                    ("single_broadcast", 3, 2), ("multi_broadcast", 1, 1), ("multi_broadcast", 3, 1),
                    ("multi_broadcast", 3, 2)}
    assert len(cells) == len(keys) * 2 * 2 and {c.cores for c in cells} == {"1", "all"}


def test_cell_identity_round_trips_and_arguments():
    cfg = _config("test")
    for cell in grid.cells(cfg):
        assert grid.Cell.of(cell.as_dict()) == cell  # as a summary records it
        assert grid.Cell.of({k: str(v) for k, v in cell.as_dict().items()}) == cell  # as a rule's wildcards
        assert cell.name == f"{cell.network}/{cell.scheme}/n{cell.n}_p{cell.p}/c{cell.cores}/{cell.consumer}/rep{cell.rep}"
        args = grid.run_args(cfg, cell, "rates.json")
        assert args[args.index("--rep") + 1] == str(cell.rep)
    cell = grid.Cell("alexnet_v2", "single_broadcast", 2, 1, "1", "emulated", 0)
    args = grid.run_args(cfg, cell, "results/calibration/rates.json")
    assert args[args.index("--preprocessors") + 1] == "1" and "--rate" not in args
    assert args[args.index("--rate-from") + 1] == "results/calibration/rates.json"
    with pytest.raises(ValueError, match="calibration file"):
        grid.run_args(cfg, cell)
    assert args[args.index("--cores") + 1] == "1" and args[args.index("--batch-size") + 1] == "16"
    assert grid.Cell.of(dict(cell.as_dict(), cores=None)).cores == "all"  # RunConfig's "all cores"
    with pytest.raises(ValueError, match="not a cell identity"):
        grid.Cell.of({"network": "x"})


def test_paper_grid_has_the_papers_cells():
    cells = grid.cells(_config("paper"))
    peak = [c for c in cells if c.consumer == "peak"]
    assert {c.n for c in peak} == set(range(5, 151, 5))
    assert {c.p for c in peak if c.scheme == "single_broadcast"} == {5, 20}
    assert not [c for c in peak if c.scheme == "single_broadcast" and c.p >= c.n]
    train = [c for c in cells if c.consumer == "train" and c.n > 1]
    assert {c.cores for c in train} == {"1", "2", "4", "8", "16"} and {c.n for c in train} == {10, 20, 30, 40, 50}


def test_accelerator_rate_relative_or_absolute(tmp_path):
    cfg = {"networks": {"alexnet_v2": {"batch_size": 8, "rc_ratio": 1.3}, "vgg_a": {"batch_size": 8, "rc": 35.4}}}
    paths = {}
    for (net, cores), rp in {("alexnet_v2", "all"): 200.0, ("alexnet_v2", "1"): 120.0}.items():
        p = tmp_path / f"{net}-{cores}.json"
        p.write_text(json.dumps({"images_per_second_per_member": rp, "machine": {"cpus": 2},
                                 "ranks": [{"cpu_seconds_per_image": 1.0 / rp}]}))
        paths[(net, cores)] = str(p)
    r = rates(cfg, paths)
    assert r["networks"]["alexnet_v2"]["rc"] == pytest.approx(260.0)
    assert r["networks"]["alexnet_v2"]["rp"] == {"1": 120.0, "all": 200.0}
    assert r["networks"]["alexnet_v2"]["rp_cpu"] == {"1": 1 / 120.0, "all": 1 / 200.0}  # the cost model's input
    assert "rc_ratio 1.3" in r["networks"]["alexnet_v2"]["rc_source"]
    assert r["networks"]["vgg_a"]["rc"] == 35.4 and "configured" in r["networks"]["vgg_a"]["rc_source"]


def test_tidy_row_of_a_summary():
    s = {"accelerator": "emulated", "emulated": True, "rate": 50.0, "batch_size": 8, "image_size": 64, "steps": 4,
         "warmup": 1, "wire_dtype": "float32", "transport": "mpi4py", "measured_window": {"seconds": 2.0},
         "images_per_second_per_member": 15.0, "cpu_seconds_total": 4.0, "node_cpu_seconds_total": 4.4,
         "per_core_busy_percent": {"h": {"0": 90.0, "1": 20.0}}, "cpu_source": "mpstat",
         "energy_joules": 250.0, "energy_above_idle_joules": 50.0, "mean_watts": 125.0, "energy_source": "modelled",
         "energy_modelled": True, "idle_watts": 100.0, "idle_source": "modelled (idle_watts parameter)",
         "energy_by_source": {"modelled": 250.0}, "dataset": {"digest": "ab"},
         "machine": {"cpu_model": "X", "cpus": 2, "gpus": None},
         "ranks": [{"images_per_second": r, "seconds": 2.0 + i, "images": 32, "step_time_p50": 0.5,
                    "wait_time_mean": 0.1, "collective_cpu_seconds": 0.1, "collective_seconds": 0.2,
                    "bytes_sent": 10, "host": "h", "exchange_paths": {"0,1": "node-shm"},
                    "queue_occupancy": {"compute": {"mean": 0.5}, "preprocessing": {"mean": 1.0}},
                    "epochs": [{"epoch": 0, "count": 20, "digest": "ab", "missing": 0}]}
                   for i, r in enumerate((10.0, 20.0))]}
    with pytest.raises(ValueError, match="names no cell"):
        cell_row(s, "old/summary.json")
    s["cell"] = {"network": "vgg_a", "scheme": "all_shared", "n": 2, "p": 2, "cores": "1", "consumer": "emulated", "rep": 0}
    row = cell_row(s, "results/runs/elsewhere/summary.json")  # the summary names its cell, not its path
    assert set(row) == set(ROW_COLUMNS)
    assert (row["network"], row["scheme"], row["n"], row["cores"], row["rep"]) == ("vgg_a", "all_shared", 2, "1", 0)
    assert row["node_cpu_seconds_per_image"] == pytest.approx(4.4 / 32 / 2)
    assert row["runtime_mean"] == 2.5 and row["runtime_max"] == 3.0 and row["per_core_busy_mean"] == 55.0
    assert row["epochs_exact"] is True and row["exchange_path"] == "node-shm" and row["energy_modelled"] is True
    assert row["machine"] == "X (2 CPUs), no GPU"


def test_measured_rc_is_used_for_trained_networks(tmp_path):
    cfg = {"networks": {"vgg_a": {"batch_size": 8}, "alexnet_v2": {"batch_size": 8, "rc": 656.0}},
           "experiments": {"t": {"consumer": "train", "networks": ["vgg_a", "alexnet_v2"], "schemes": ["baseline"],
                                 "n": [1]}}}
    assert grid.trained_networks(cfg) == ["vgg_a"]  # alexnet_v2's rc is typed in
    m = tmp_path / "rc.json"
    m.write_text(json.dumps({"rc": 154.0, "device": "GPU"}))
    r = rates(cfg, {}, {"vgg_a": str(m)})
    assert r["networks"]["vgg_a"]["rc"] == 154.0 and "GPU" in r["networks"]["vgg_a"]["rc_source"]
    assert r["networks"]["alexnet_v2"]["rc"] == 656.0


def test_reductions_against_the_baseline_and_their_ceiling():
    import pandas as pd

    key = {"network": "vgg_a", "consumer": "emulated", "cores": "1", "batch_size": 8, "image_size": 64}
    df = pd.DataFrame([
        {**key, "n": 2, "scheme": "baseline", "node_cpu_seconds_per_image": 4.0, "process_cpu_seconds_per_image": 3.0},
        {**key, "n": 2, "scheme": "baseline", "node_cpu_seconds_per_image": 2.0, "process_cpu_seconds_per_image": 3.0},
        {**key, "n": 2, "scheme": "all_shared", "node_cpu_seconds_per_image": 1.6, "process_cpu_seconds_per_image": 1.5},
        {**key, "n": 2, "scheme": "multi_broadcast", "node_cpu_seconds_per_image": 1.5,
         "process_cpu_seconds_per_image": 1.0},
        {**key, "n": 4, "scheme": "all_shared", "node_cpu_seconds_per_image": 1.0, "process_cpu_seconds_per_image": 1.0},
    ])
    out = add_reductions(df)
    assert out["cpu_reduction_node"].tolist()[2:4] == [3.0 / 1.6, 2.0] and out["cpu_reduction_process"][2] == 2.0
    assert out["exceeds_ceiling"].tolist()[2:4] == [False, True]  # 3x by process CPU between 2 members
    assert out["reduction_ceiling"][2] == 2 and out.iloc[:2]["exceeds_ceiling"].isna().all()
    assert pd.isna(out["cpu_reduction_node"][4]) and pd.isna(out["exceeds_ceiling"][4])  # no baseline at n = 4


def test_the_ceilings_tolerance_is_the_tables_own_repeat_noise():
    import pandas as pd

    from enspipe.report.collect import CEILING_TOLERANCE, MAX_CEILING_TOLERANCE, ceiling_tolerance

    key = {"network": "vgg_a", "consumer": "peak", "cores": "1", "batch_size": 8, "image_size": 64, "n": 1}

    def table(*cpus):
        return pd.DataFrame([{**key, "scheme": "baseline", "process_cpu_seconds_per_image": c} for c in cpus])

    assert ceiling_tolerance(table(1.0, 1.01, 0.99)) == CEILING_TOLERANCE  # quiet repeats: the floor
    # 4% from the median: a ratio of two such cells strays by up to 1.04 / 0.96 - 1
    assert ceiling_tolerance(table(1.0, 1.04, 0.98)) == pytest.approx(1.04 / 0.96 - 1)
    assert ceiling_tolerance(table(1.0, 1.5, 1.0)) == MAX_CEILING_TOLERANCE  # never more than the cap
    assert ceiling_tolerance(table(1.0, 1.5)) == CEILING_TOLERANCE  # two repeats have no median to trust
    # a single-repeat 2.12x at n = 2 is within the noise of a table whose repeats vary by 8%...
    shared = [{**key, "n": 2, "consumer": "emulated", "scheme": s, "process_cpu_seconds_per_image": c,
               "node_cpu_seconds_per_image": c} for s, c in (("baseline", 2.12), ("all_shared", 1.0))]
    noisy = pd.concat([table(1.0, 1.08, 0.97), pd.DataFrame(shared)], ignore_index=True)
    assert not add_reductions(noisy)["exceeds_ceiling"].iloc[-1]
    # ...and a measuring error in a quiet one
    quiet = pd.concat([table(1.0, 1.01, 0.99), pd.DataFrame(shared)], ignore_index=True)
    out = add_reductions(quiet)
    assert out["exceeds_ceiling"].iloc[-1] and out["ceiling_tolerance"].iloc[-1] == CEILING_TOLERANCE


def test_invalid_combinations_are_reported_and_an_empty_experiment_is_an_error():
    cfg = {"networks": {"vgg_a": {"batch_size": 2}},
           "experiments": {"mixed": {"consumer": "peak", "networks": ["vgg_a"], "schemes": ["single_broadcast"],
                                     "n": [2, 3], "p": [1, 2]}}}
    cells, notes = grid.expand(cfg)
    assert {(c.n, c.p) for c in cells} == {(2, 1), (3, 1), (3, 2)}
    assert len(notes) == 1 and "experiments.mixed: 1 invalid combination" in notes[0] and "P < N" in notes[0]
    cfg["experiments"]["mixed"]["p"] = [3]
    with pytest.raises(grid.GridError, match=r"experiments\.mixed: no valid cell.*P < N"):
        grid.expand(cfg)
    cfg["experiments"]["mixed"] |= {"schemes": ["all_shared"], "n": [4]}  # a batch of 2 among 4 members
    with pytest.raises(grid.GridError, match=r"experiments\.mixed: no valid cell.*batch >= P"):
        grid.expand(cfg)
    del cfg["experiments"]["mixed"]["p"]
    cfg["experiments"]["mixed"] |= {"schemes": ["multi_broadcast"], "n": [2]}
    with pytest.raises(grid.GridError, match=r"experiments\.mixed: no valid cell.*needs the number of preprocessors"):
        grid.expand(cfg)


def test_the_default_grid_drops_nothing_and_the_papers_says_what_it_drops():
    assert grid.expand(_config("config"))[1] == []
    notes = grid.expand(_config("paper"))[1]  # e.g. All-Shared's batch of 128 among n = 130..150 members
    assert notes and all(any(rule in n for rule in ("P < N", "P <= N", "batch >= P")) for n in notes)


def test_the_schemas_run_defaults_are_run_configs():
    """Where the workflow's schema spells out a run option's default, it is RunConfig's (one value)."""
    from enspipe.run.run_options import default

    schema = yaml.safe_load(open(os.path.join(ROOT, "workflow", "schemas", "config.schema.yaml")))
    power = schema["properties"]["power"]["properties"]
    assert tuple(power["sources"]["default"]) == default("power")
    assert power["idle_watts"]["default"] == default("idle_watts")
    assert power["watts_per_core"]["default"] == default("watts_per_core")
    assert schema["properties"]["seed"]["default"] == default("seed")
    assert schema["properties"]["monitor_interval"]["default"] == default("monitor_interval")


def test_a_cells_slurm_request_spreads_members_over_nodes():
    """slurm.members_per_node becomes --ntasks-per-node (memory per node follows), gpus_per_member
    --gpus-per-task; without them Slurm packs the cell, as before."""
    base = {"exclusive": True, "mem_mb_per_task": 1000}
    assert grid.slurm_request({"slurm": base}, 4) == {"slurm_extra": "--exclusive", "mem_mb": 4000}
    spread = grid.slurm_request({"slurm": base | {"members_per_node": 2, "gpus_per_member": 1}}, 4)
    assert spread == {"slurm_extra": "--exclusive --ntasks-per-node=2 --gpus-per-task=1", "mem_mb": 2000}
    assert grid.slurm_request({"slurm": base | {"members_per_node": 8, "exclusive": False}}, 3) == \
        {"slurm_extra": "--ntasks-per-node=3", "mem_mb": 3000}
    assert grid.slurm_request({"slurm": base}, 4, per_node=1)["slurm_extra"] == "--exclusive --ntasks-per-node=1"


def test_an_experiment_places_its_own_cells_and_a_conflict_is_named():
    cfg = _config("test")
    cfg["experiments"]["training"]["members_per_node"] = 1
    placed = grid.members_per_node(cfg)
    assert placed and set(placed.values()) == {1} and all(c.consumer == "emulated" and c.n == 2 for c in placed)
    cfg["experiments"]["again"] = dict(cfg["experiments"]["training"], members_per_node=2)
    with pytest.raises(grid.GridError, match="members_per_node"):
        grid.members_per_node(cfg)


def test_a_lag_cells_rate_is_a_members_share_of_the_calibrated_rate(tmp_path):
    """The slow member's rc / slowdown then lies below what any arm delivers to a member."""
    cfg = _config("test")
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"networks": {"alexnet_v2": {"rp": {"1": 600.0, "2": 1000.0}}}}))
    cell = grid.lag_cells(cfg)[0]
    args = grid.lag_args(cfg, cell, str(rates))
    assert "--rate-from" not in args and float(args[args.index("--rate") + 1]) == 600.0 / cell.n
    assert args[args.index("--slow-member") + 1] == "1:3.0"



def test_the_configs_preprocessing_path_and_decode_cache_reach_every_cell():
    cfg = _config("test")
    cell = grid.cells(cfg)[0]
    args = grid.run_args(cfg, cell, "rates.json")
    assert args[args.index("--preprocess-impl") + 1] == "crop-first" and args[args.index("--decode-cache") + 1] == "0"
    args = grid.run_args({**cfg, "decode_cache": "8GB", "preprocess_impl": "reference"}, cell, "rates.json")
    assert args[args.index("--preprocess-impl") + 1] == "reference" and args[args.index("--decode-cache") + 1] == "8GB"


def test_cells_of_one_n_and_core_limit_share_a_job():
    cells = [grid.Cell(net, s, n, n, cores, "peak", rep) for net in ("alexnet_v2", "vgg_a")
             for s in ("baseline", "all_shared") for n in (1, 2) for cores in ("1", "all") for rep in (0, 1)]
    cells += [grid.Cell("alexnet_v2", "tfdata_service", 2, 1, "all", "peak", 0),
              grid.Cell("alexnet_v2", "auto", 2, 2, "all", "peak", 0)]
    assert grid.cell_jobs({}, cells) == {}  # cells_per_job 1 (the default): every cell alone
    jobs = grid.cell_jobs({"cells_per_job": 3}, cells, {cells[0]: 1})
    # each n and core limit: 4 rounds (2 networks x 2 repeats) of baseline and All-Shared, a job each
    # (two rounds of 2 do not fit in 3); at n = 1, 1 core, the cell placed per node leaves a round
    # of 1, which shares its job with the next round
    assert sorted(jobs) == sorted(f"n{n}_c{c}_{i}" for n in (1, 2) for c in ("1", "all") for i in range(4)
                                  if (n, c, i) != (1, "1", 3))
    assert [len(j) for j in (jobs[f"n1_c1_{i}"] for i in range(3))] == [3, 2, 2]
    shared = [c for job in jobs.values() for c in job]
    assert len(shared) == len(set(shared)) and all(len(job) in (2, 3) for job in jobs.values())
    assert all(len({(c.n, c.cores) for c in job}) == 1 for job in jobs.values())
    alone = set(cells) - set(shared)  # the peer, the planner's and the one placed per node
    assert {c.scheme for c in alone} >= {"tfdata_service", "auto"} and cells[0] in alone
    # in cells_per_job 10, a comparison's repeats alternate in one job: A B A B
    jobs = grid.cell_jobs({"cells_per_job": 10}, cells)
    assert [(c.network, c.scheme, c.rep) for c in jobs["n2_c1_0"]] == [
        (net, s, rep) for net in ("alexnet_v2", "vgg_a") for rep in (0, 1) for s in ("all_shared", "baseline")]
