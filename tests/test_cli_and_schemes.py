import dataclasses
import pathlib
import subprocess
import sys

import pytest

from conftest import enspipe, said
from enspipe.plan.errors import ConfigError
from enspipe.run.config import RunConfig
from enspipe.plan.schemes import AUTO, MAX_UNIT_BATCHES, SCHEME_KINDS, Broadcast, Gather, make_scheme, node_groups


@pytest.mark.parametrize("args, option", [
    (["--steps", "0"], "--steps"),
    (["--cores", "0"], "--cores"),
    (["--consumer", "emulated"], "--rate"),
    (["--image-size", "8"], "--image-size"),
    (["--network", "resnet"], "--network"),
    (["--scheme", "single_broadcast"], "--preprocessors"),
    (["--scheme", "all_shared", "--batch-size", "0"], "--batch-size"),
    (["--power", "wattmeter"], "--power"),
    (["--power", "auto,rapl"], "--power"),
    (["--power", "external"], "--power-csv"),
    (["--power-csv", "/no/such.csv"], "--power-csv"),
    (["--idle-power", "/no/idle.json"], "--idle-power"),
    (["--idle-watts", "-1"], "--idle-watts"),
    (["--monitor-interval", "0"], "--monitor-interval"),
    (["--cpu-monitor", "none", "--power", "modelled"], "--power"),
])
def test_bad_arguments_exit_2_naming_the_option(dataset, tmp_path, args, option):
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", *args)
    assert r.returncode == 2, r.stderr
    assert option in r.stderr
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.fixture
def flags(monkeypatch):
    """Messages as the command line spells them (a cell's options are its flags)."""
    from enspipe.common import spelling

    monkeypatch.setitem(spelling._mode, "flags", True)


def test_mpstat_requested_but_missing_names_the_fix(dataset, tmp_path):
    import os
    import sys

    path = os.path.dirname(sys.executable)  # the venv's bin: no sysstat there
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--cpu-monitor", "mpstat", env={"PATH": path})
    assert r.returncode == 2 and "--cpu-monitor" in r.stderr and "sysstat" in r.stderr


def test_horovod_transport_without_horovod_names_the_fix(dataset, tmp_path):
    import importlib.util

    if importlib.util.find_spec("horovod") is not None:
        pytest.skip("Horovod is installed here (tests/test_horovod.py runs the transport)")
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--transport", "horovod")
    assert r.returncode == 2 and "--transport" in r.stderr and "make horovod" in r.stderr


def test_a_gpu_backend_that_cannot_run_here_names_the_way_out_as_its_caller_spells_it(dataset, tmp_path):
    """No torch, or no CUDA: the command line is told --backend pillow, a Python caller backend='pillow'."""
    import enspipe as lib

    if _cuda():
        pytest.skip("this machine has CUDA: the gpu backend runs")
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--backend", "gpu")
    assert r.returncode == 2 and "--backend: the gpu backend" in r.stderr, r.stderr
    assert "pass --backend pillow (the CPU)" in r.stderr and "backend='pillow'" not in r.stderr, r.stderr
    with pytest.raises(lib.ConfigError, match=r"backend=: the gpu backend .*pass backend='pillow' \(the CPU\)"):
        lib.StreamConfig(data=dataset, batch_size=4, backend="gpu")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_torch_transport_without_torch_names_the_fix(dataset, tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here (tests/test_torch_transport.py runs the transport)")
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--transport", "torch")
    assert r.returncode == 2 and "--transport: torch is not installed here; pip install 'enspipe[torch]'" in r.stderr
    assert not (tmp_path / "o").exists()


def test_missing_dataset_names_the_fix(tmp_path):
    r = enspipe("run", "--data", tmp_path / "nope", "--out", tmp_path / "o")
    assert r.returncode == 2 and "--data" in r.stderr and "make-dataset" in r.stderr


def test_config_error_fields(flags):
    with pytest.raises(ConfigError) as e:
        RunConfig.of(data=".", out="o", queue_depth=0)
    assert e.value.field == "queue_depth" and "queue-depth" in str(e.value)


@pytest.mark.parametrize("name, value", [("network", "resnet"), ("consumer", "gpu"), ("scheme", "ring"),
                                         ("wire_dtype", "float16"), ("transport", "nccl"), ("on_corrupt", "ignore"),
                                         ("cpu_monitor", "top")])
def test_a_value_outside_an_options_choices_names_it_and_the_choices(name, value):
    """Checked by RunConfig itself (a config built without the parser), from the option's declared choices."""
    with pytest.raises(ConfigError) as e:
        RunConfig.of(data=".", out="o", **{name: value})
    assert e.value.field == name and repr(value) in e.value.problem and "choose one of" in e.value.fix


@pytest.mark.parametrize("batch", [7, 8, 13])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_shares_cover_the_batch_unevenly_allowed(batch, p):
    s = make_scheme("multi_broadcast", 4, p, batch)
    shares = [s.share(r, batch) for r in range(4)]
    covered = [i for lo, hi in shares for i in range(lo, hi)]
    assert covered == list(range(batch))
    sizes = [hi - lo for lo, hi in shares[:p]]
    assert max(sizes) - min(sizes) <= 1


def test_a_unit_holds_block_images_of_the_smallest_share_at_most_eight_batches():
    """Every rank derives the same unit from the scheme: ceil(block / smallest share), 1..8."""
    assert make_scheme("baseline", 4, None, 32).unit_batches(32, 32) == 1  # the whole batch is the share
    assert make_scheme("all_shared", 2, None, 32).unit_batches(32, 32) == 2
    assert make_scheme("all_shared", 4, None, 32).unit_batches(32, 32) == 4
    assert make_scheme("all_shared", 3, None, 32).unit_batches(32, 32) == 4  # shares 11, 11, 10
    assert make_scheme("all_shared", 4, None, 64).unit_batches(64, 32) == 2
    assert make_scheme("all_shared", 32, None, 32).unit_batches(32, 32) == MAX_UNIT_BATCHES
    assert make_scheme("single_broadcast", 4, 1, 32).unit_batches(32, 32) == 1  # one preprocessor, whole batches
    assert make_scheme("all_shared", 4, None, 32).unit_batches(32, 1) == 1
    # a measured window of whole units: the largest unit not above that divides its steps
    assert [make_scheme("all_shared", 4, None, 32).unit_batches(32, 32, s) for s in (60, 30, 25, 7)] == [4, 3, 1, 1]
    assert make_scheme("all_shared", 32, None, 32).unit_batches(32, 32, 24) == 8
    for n in range(1, 9):
        s = make_scheme("multi_broadcast", 8, n, 32)
        assert {s.unit_batches(32, 32) for _ in range(3)} == {min(8, -(-32 // (32 // n)))}


def test_block_images_is_checked(flags):
    with pytest.raises(ConfigError) as e:
        RunConfig.of(data=".", out="o", block_images=0)
    assert e.value.field == "block_images" and "block-images" in str(e.value)


def test_scheme_shapes():
    sb = make_scheme("single_broadcast", 5, 3, 32)
    assert sb.steps == (Gather((0, 1, 2)), Broadcast((2, 3, 4), 2))
    assert [sb.role(r) for r in range(5)] == ["preprocessor", "preprocessor", "leader", "compute-only", "compute-only"]
    assert make_scheme("all_shared", 3, None, 9).steps == (Gather((0, 1, 2)),)
    assert make_scheme("all_shared", 1, None, 9).steps == () == make_scheme("multi_broadcast", 1, 1, 9).steps
    assert make_scheme("baseline", 3, None, 1).steps == () and make_scheme("baseline", 3, None, 4).share(2, 4) == (0, 4)


def test_hierarchical_plans_see_the_node_layout():
    two = ((0, 1), (2, 3))
    h = make_scheme("hierarchical", 4, None, 8, two)
    assert h.steps == (Gather((0, 1)), Gather((2, 3)), Gather((0, 2)), Broadcast((0, 1), 0), Broadcast((2, 3), 2))
    assert h.uses() == {(0, 1): 2, (2, 3): 2, (0, 2): 1}  # a node's group assembles twice per batch
    # what each member holds when it contributes: its share, then its node's part, then the batch
    assert h.block_counts(8) == [[2, 2], [2, 2], [4, 4], 8, 8]
    assert make_scheme("hierarchical", 4, None, 8).steps == make_scheme("all_shared", 4, None, 8).steps  # one node
    # interleaved nodes: shares go node by node, so the leaders' gather assembles the batch in order
    inter = make_scheme("hierarchical", 4, None, 8, node_groups([0, 1, 0, 1]))
    assert inter.preprocessors == (0, 2, 1, 3) and [inter.share(r, 8) for r in (0, 2, 1, 3)] == [(0, 2), (2, 4),
                                                                                                 (4, 6), (6, 8)]
    assert inter.steps[:3] == (Gather((0, 2)), Gather((1, 3)), Gather((0, 1)))
    # a node of one member needs no collective within it
    uneven = make_scheme("hierarchical", 4, None, 8, node_groups([0, 1, 1, 1]))
    assert uneven.steps == (Gather((1, 2, 3)), Gather((0, 1)), Broadcast((1, 2, 3), 1))
    assert uneven.block_counts(8) == [[2, 2, 2], [2, 6], 8]
    # the other schemes' counts are each member's own share, as before
    assert make_scheme("single_broadcast", 5, 3, 32).block_counts(32) == [[11, 11, 10], 32]
    assert make_scheme("multi_broadcast", 4, 2, 8).block_counts(8) == [[4, 4, 0, 0]]


def test_every_surface_reads_the_scheme_registry():
    import yaml

    from enspipe.cli import build_parser
    from enspipe.run.concerns import SCHEMES

    names = list(SCHEME_KINDS) + [AUTO]  # the registry's schemes, and the planner's choice
    assert list(SCHEMES) == names
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions if a.dest == "scheme")
    assert list(run.choices) == names
    repo = pathlib.Path(__file__).resolve().parents[1]
    schema = yaml.safe_load((repo / "workflow/schemas/config.schema.yaml").read_text())
    enum = schema["properties"]["experiments"]["additionalProperties"]["properties"]["schemes"]["items"]["enum"]
    assert enum == names, "workflow/schemas/config.schema.yaml's scheme enum must list the registry's schemes"


@pytest.mark.parametrize("name, n, p, batch, field", [
    ("single_broadcast", 3, 3, 32, "preprocessors"),
    ("single_broadcast", 3, None, 32, "preprocessors"),
    ("multi_broadcast", 3, 4, 32, "preprocessors"),
    ("multi_broadcast", 3, 0, 32, "preprocessors"),
    ("all_shared", 4, None, 3, "batch_size"),
    ("all_shared", 4, 2, 32, "preprocessors"),
    ("hierarchical", 4, 2, 32, "preprocessors"),
    ("hierarchical", 4, None, 3, "batch_size"),
    ("nope", 4, None, 32, "scheme"),
])
def test_invalid_combinations_are_rejected(name, n, p, batch, field):
    with pytest.raises(ConfigError) as e:
        make_scheme(name, n, p, batch)
    assert e.value.field == field and e.value.fix


def test_make_dataset_cli(tmp_path):
    r = enspipe("make-dataset", "--out", tmp_path / "d", "--num-images", "3", "--seed", "1")
    assert r.returncode == 0 and (tmp_path / "d" / "manifest.json").exists()
    assert enspipe("make-dataset", "--out", tmp_path / "e", "--num-images", "0").returncode == 2


@pytest.mark.parametrize("cores, members, host_cpus, sharing, threads", [
    ([0, 1], 1, 2, False, 2),        # one member, every core
    ([0], 2, 2, False, 1),           # --cores 1 each, room for both
    ([0, 1], 2, 2, True, 1),         # all cores each, two members: a fair share
    ([0, 1], 4, 2, True, 1),         # more members than cores: one thread, not two
    ([0, 1, 2, 3], 2, 8, True, 4),   # a share of 4 of 8 cores
])
def test_thread_pools_are_sized_from_the_hosts_cores(cores, members, host_cpus, sharing, threads):
    from enspipe.engine.placement import Placement

    p = Placement("h", 0, members, host_cpus, 0, cores, sharing, {})
    assert p.threads == threads


def test_run_options_are_declared_once_on_the_run_config(dataset, tmp_path):
    """The parser is built from RunConfig's fields: each default is the field's, each value parses."""
    from enspipe.cli import build_parser
    from enspipe.commands.cells import config_from_args
    from enspipe.run.run_options import option_fields

    base = ["run", "--data", str(dataset), "--out", str(tmp_path)]
    cfg = config_from_args(build_parser().parse_args(
        base + ["--lr", "0.1,0.2", "--no-node-shm", "--power", "modelled", "--cores", "1", "--skip-corrupt"]))
    assert (cfg.training.lrs, cfg.stream.node_shm, cfg.energy.power, cfg.measure.cores, cfg.faults.on_corrupt) == \
        ((0.1, 0.2), False, ("modelled",), 1, "skip")
    defaults = config_from_args(build_parser().parse_args(base))
    flat = defaults.to_dict()
    options = [f for f in option_fields() if f.name not in ("data", "out", "batch_size")]  # (to_dict resolves it)
    assert len(options) > 25
    for f in options:
        want = list(f.default) if isinstance(f.default, tuple) else f.default
        assert flat[f.name] == want, f.name


def test_the_run_config_is_one_small_config_per_concern(flags):
    """Each option belongs to exactly one concern; RunConfig.of routes flat names to it, replaced()
    keeps the others, and a concern's own bad value fails when the concern is made."""
    from enspipe.run.concerns import CONCERNS, MeasureOptions
    from enspipe.run.run_options import option_fields
    from enspipe.plan.errors import ConfigError

    names = [f.name for f in option_fields()]
    assert len(names) == len(set(names))
    assert all(len(dataclasses.fields(c)) <= 15 for c in CONCERNS.values())
    cfg = RunConfig.of(data=".", out="o", steps=7, scheme="all_shared", power=("modelled",))
    assert (cfg.measure.steps, cfg.stream.scheme, cfg.energy.power) == (7, "all_shared", ("modelled",))
    again = cfg.replaced(scheme="baseline", warmup=3)
    assert (again.stream.scheme, again.measure.warmup, again.measure.steps, again.energy) == \
        ("baseline", 3, 7, cfg.energy)
    with pytest.raises(ConfigError, match="--steps"):
        MeasureOptions(steps=0)
    with pytest.raises(ConfigError, match="--power"):  # across concerns: the model needs the monitor
        RunConfig.of(data=".", out="o", power=("modelled",), cpu_monitor="none")
    with pytest.raises(TypeError, match="no option 'stepz'"):
        RunConfig.of(data=".", out="o", stepz=7)


def test_every_transport_offers_the_engines_interface():
    import inspect

    from enspipe.exchange.base import Transport
    from enspipe.exchange.engine import Mpi4pyTransport
    from enspipe.exchange.horovod import HorovodTransport

    for cls in (Mpi4pyTransport, HorovodTransport):
        assert isinstance(cls.name, str)
        for method in ("allgatherv", "broadcast", "block_broadcasts", "close"):
            want = list(inspect.signature(getattr(Transport, method)).parameters)
            assert list(inspect.signature(getattr(cls, method)).parameters) == want, (cls.__name__, method)


def test_a_process_imports_only_what_it_uses_of_tensorflow_keras_pandas_and_matplotlib():
    """TensorFlow's import loads Keras (and Keras pandas and matplotlib) at once: a rank that trains
    no model imports none of them, one that trains imports Keras alone; tf.keras is still Keras 3
    when first used, and pandas still imports when the process asks for it."""
    code = ("import os, sys\n"
            "from enspipe.common.tfimport import import_tensorflow\n"
            "import_tensorflow(trains=False)\n"
            "assert not {'keras', 'pandas', 'matplotlib'} & set(sys.modules), 'loaded'\n"
            "assert 'TF_USE_LEGACY_KERAS' not in os.environ\n"
            "import_tensorflow(trains=True)\n"
            "assert 'keras' in sys.modules and not {'pandas', 'matplotlib'} & set(sys.modules)\n"
            "import tensorflow as tf, keras, pandas\n"
            "assert tf.keras.layers.Dense is keras.layers.Dense and pandas.DataFrame\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, said(r)
