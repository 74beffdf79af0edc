"""Measured profiles (issue 19): `enspipe profile` trains a network as one data-parallel member on
g = 1, 2, ... ranks, caches the rates per machine, and an ensemble spec's member reads them."""
import json
from pathlib import Path

import pytest

from conftest import enspipe
from enspipe.plan.ensemble import Ensemble
from enspipe.plan.errors import ConfigError
from enspipe.plan.fleet import fill_rates, measured_profile


def test_rates_between_and_beyond_the_measured_counts():
    assert fill_rates([1, 2, 4], [100, 180, 300]) == (100, 180, 240, 300)
    assert fill_rates([2], [200]) == (100, 200)
    p = measured_profile("a", (100, 180), 4)
    assert p.source == "measured" and p.rates[:2] == (100, 180) and p.rates[3] < 4 * 90  # decays beyond
    assert measured_profile("b", (50,), 2).rates == (50, 100)
    with pytest.raises(ConfigError):
        fill_rates([1, 1], [1, 2])


def test_a_member_with_measured_rates_is_planned_on_them():
    ens = Ensemble.from_dict({"accelerators": 2, "members": [
        {"name": "a", "rate": 100, "epochs": 1, "network": "tiny", "rates": [100, 50]}]})
    assert ens.profile(0).source == "measured" and ens.profile(0).rate(2) == 50
    with pytest.raises(ConfigError):  # a measured profile is a network's
        Ensemble.from_dict({"accelerators": 2, "members": [{"name": "a", "rate": 1, "epochs": 1, "rates": [1]}]})


@pytest.mark.mpi
def test_profile_measures_each_count_caches_it_and_a_spec_reads_it(dataset, tiny_profile, tmp_path):
    path, args = tiny_profile
    rec = json.loads(path.read_text())
    assert rec["source"] == "measured" and rec["device"] == "CPU" and rec["accelerators"] == [1, 2]
    for x in rec["runs"]:  # every step trains, the warm-up's (2, then a drain) and the window's 4, of 8 images
        warmup_steps = json.loads((Path(x["out"]) / "summary.json").read_text())["window"]["warmup_steps"]
        assert x["rate"] > 0 and warmup_steps > 2 and x["trained_images"] == 8 * (warmup_steps + 4)
    # its layers at each count: tiny's 6 gradients, their bytes, made last layers first after the forward pass
    for g, batch in (("1", 8), ("2", 4)):
        layers = rec["layers"][g]
        assert layers["batch"] == batch and len(layers["names"]) == 6 and layers["forward_s"] > 0
        assert layers["bytes"] == [864, 32, 4608, 64, 640, 40]  # two convolutions and a dense layer, float32
        assert len(layers["ready_s"]) == 6 and min(layers["ready_s"]) >= 0
    again = enspipe(*args)
    assert again.returncode == 0 and "cached" in again.stdout
    assert json.loads(path.read_text())["measured"] == rec["measured"]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"accelerators": 2, "members": [
        {"name": "a", "epochs": 1, "network": "tiny", "profile": str(path)},
        {"name": "b", "epochs": 1, "network": "vgg_a", "profile": str(path)}]}))
    r = enspipe("ensemble", "--spec", spec, "--arm", "fleet", "--data", dataset, "--out", tmp_path / "o",
                "--batch-size", 10)
    assert r.returncode == 2 and "'vgg_a'" in r.stderr and "profile" in r.stderr, r.stderr[-2000:]


@pytest.mark.timing
def test_the_first_layers_gradients_are_ready_last():
    """Backpropagation makes the last layer's gradients first and the first layer's last, and the
    profile's hooks see that order. At 96 px and batch 16 tiny's first convolution takes ms to
    differentiate, so a hook run late on a loaded machine does not reverse the medians (at 32 px
    and batch 4 the whole backward pass takes about 1 ms, under the hooks' scheduling noise: a
    loaded CI machine once read the dense layer's 0.89 ms after the first convolution's 0.79 ms)."""
    from enspipe.run.profile import layer_profile

    ready = layer_profile("tiny", 10, 96, 16, steps=10).ready
    assert min(ready[:2]) > max(ready[-2:]) >= 0, ready


def test_bad_profile_options_exit_2(dataset, tmp_path):
    r = enspipe("profile", "--network", "tiny", "--data", dataset, "--cache", tmp_path, "--accelerators", "0")
    assert r.returncode == 2 and "--accelerators" in r.stderr
    r = enspipe("profile", "--network", "nope", "--data", dataset, "--cache", tmp_path)
    assert r.returncode == 2 and "--network" in r.stderr
