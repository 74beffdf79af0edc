"""A user's own model as package.module:function in a cell, an ensemble spec and the workflow's schema."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from conftest import enspipe, said, summary
from enspipe.models.networks import NETWORKS, USER_NETWORK, NetworkError, network_spec
from enspipe.plan.ensemble import ARMS, Ensemble
from enspipe.plan.errors import ConfigError
from enspipe.plan.schemes import SCHEME_KINDS

USERNETS = '''
import keras

def build(num_classes, image_size, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((image_size, image_size, 3)), keras.layers.Conv2D(4, 3, strides=4),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(num_classes)])
build.batch_size = 10

def not_a_model(num_classes, image_size, seed):
    return "a model"

def raises(num_classes, image_size, seed):
    raise RuntimeError("my model is broken")

NOT_CALLABLE = 3
'''


@pytest.fixture
def usernets(tmp_path, monkeypatch):
    (tmp_path / "usernets.py").write_text(USERNETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    yield tmp_path
    sys.modules.pop("usernets", None)


def test_a_factory_is_resolved_with_its_attributes_and_built(usernets):
    spec = network_spec("usernets:build")
    assert (spec.batch_size, spec.preprocessing) == (10, "inception")
    assert spec.build(7, 32, 1).output_shape == (None, 7)


@pytest.mark.parametrize("name, says", [
    ("nomodule_here:build", "cannot import nomodule_here"),
    ("usernets:nothing", "usernets has no nothing"),
    ("usernets:NOT_CALLABLE", "not a function"),
    ("usernets", "unknown network"),
])
def test_a_factory_that_cannot_be_had_is_named(usernets, name, says):
    with pytest.raises(NetworkError) as e:
        network_spec(name)
    assert says in str(e.value)


@pytest.mark.slow  # each probe starts a process with TensorFlow; quick: a factory that cannot be had, above
@pytest.mark.parametrize("name, says", [("usernets:not_a_model", "returned str, not a keras.Model"),
                                        ("usernets:raises", "my model is broken")])
def test_a_factory_that_returns_no_model_is_named_when_built(usernets, name, says):
    with pytest.raises(NetworkError) as e:
        network_spec(name).build(3, 32)
    assert name in str(e.value) and says in str(e.value)
    with pytest.raises(NetworkError) as e:  # the same, in a child process: this one's TensorFlow stays unstarted
        network_spec(name).probe(3, 32)
    assert name in str(e.value) and says in str(e.value)
    network_spec("usernets:build").probe(3, 32)


def test_the_workflow_schema_reads_the_registries():
    schema = yaml.safe_load((pathlib.Path(__file__).resolve().parents[1] / "workflow/schemas/config.schema.yaml")
                            .read_text())
    registered, user = schema["$defs"]["network"]["anyOf"]
    assert registered["enum"] == list(NETWORKS)
    assert user["pattern"] == USER_NETWORK.pattern
    props = schema["properties"]
    assert props["lag"]["properties"]["schemes"]["items"]["enum"] == list(SCHEME_KINDS)
    assert props["heterogeneous"]["properties"]["arms"]["items"]["enum"] == list(ARMS)
    import jsonschema

    net = {"$defs": schema["$defs"], "$ref": "#/$defs/network"}
    jsonschema.validate("usernets:build", net)
    jsonschema.validate("my_pkg.models:wide_resnet", net)
    for bad in ("alexnet", "usernets:build; rm -rf /", "a:b:c"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, net)


def test_an_ensemble_spec_takes_a_users_network(usernets):
    Ensemble.from_dict({"accelerators": 2, "members": [{"name": "a", "rate": 10, "epochs": 1,
                                                        "network": "usernets:build"}]})
    with pytest.raises(ConfigError) as e:
        Ensemble.from_dict({"accelerators": 2, "members": [{"name": "a", "rate": 10, "epochs": 1,
                                                            "network": "usernets:gone"}]})
    assert "usernets has no gone" in str(e.value)


@pytest.mark.mpi
def test_a_cell_trains_a_users_network(usernets, dataset, tmp_path):
    out = tmp_path / "cell"
    r = enspipe("run", "--data", dataset, "--out", out, "--network", "usernets:build", "--consumer", "train",
                "--scheme", "all_shared", "--image-size", 32, "--warmup", 2, "--steps", 6, "--cpu-monitor", "none", n=2)
    assert r.returncode == 0, said(r)
    s = summary(out)
    assert s["network"] == "usernets:build" and s["batch_size"] == 10 and s["preprocessing"] == "inception"
    assert all(x["network"] == "usernets:build" and x["loss_last"] is not None for x in s["ranks"])


@pytest.mark.mpi
@pytest.mark.slow
def test_a_bad_users_network_fails_the_cell_naming_it(usernets, dataset, tmp_path):
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "a", "--network", "usernets:gone", n=2)
    assert r.returncode == 2 and "--network" in r.stderr and "usernets has no gone" in r.stderr
    for name, says in (("usernets:not_a_model", "usernets:not_a_model returned str, not a keras.Model"),
                       ("usernets:raises", "raised RuntimeError: my model is broken")):
        out = tmp_path / name.replace(":", "_")
        r = enspipe("run", "--data", dataset, "--out", out, "--network", name, "--consumer", "train",
                    "--image-size", 32, "--cpu-monitor", "none", n=2, timeout=120)
        assert r.returncode == 2 and "--network" in r.stderr and says in r.stderr, r.stderr[-2000:]
        assert not out.exists()  # built before MPI started: no rank set up its output


@pytest.mark.mpi
@pytest.mark.slow
def test_an_ensemble_arm_trains_members_of_a_users_network(usernets, dataset, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"accelerators": 2, "members": [
        {"name": "a", "rate": 60, "epochs": 1, "network": "usernets:build", "lr": 0.05},
        {"name": "b", "rate": 30, "epochs": 2, "network": "usernets:build", "lr": 0.02}]}))
    r = subprocess.run([sys.executable, "-m", "enspipe", "ensemble", "--spec", str(spec), "--arm", "default",
                        "--data", dataset, "--out", str(tmp_path / "arm"), "--batch-size", "10", "--in-job", "--",
                        "--image-size", "32", "--cpu-monitor", "none", "--shuffle-buffer", "16"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, said(r)
    states = json.loads((tmp_path / "arm" / "ensemble.json").read_text())["member_states"]
    assert {k: v["epochs"] for k, v in states.items()} == {"a": 1, "b": 2}
