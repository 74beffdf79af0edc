import numpy as np
import pytest

from enspipe.run.consumers import EmulatedConsumer, PeakConsumer, TrainConsumer
from enspipe.models.networks import NETWORKS


def test_paper_batch_sizes():
    assert {k: v.batch_size for k, v in NETWORKS.items() if k != "tiny"} == \
        {"alexnet_v2": 128, "inception_v1": 32, "vgg_a": 32, "resnet_50": 32, "mobilenet_v2": 32}


@pytest.mark.parametrize("name", ["alexnet_v2", "inception_v1", "vgg_a", "resnet_50", "mobilenet_v2", "tiny"])
def test_builds_at_small_sizes(name):
    model = NETWORKS[name].build(num_classes=7, image_size=64, seed=1)
    assert model(np.zeros((2, 64, 64, 3), np.float32)).shape == (2, 7)


@pytest.mark.slow  # 180 M parameters to initialise
def test_slim_shapes_at_224():
    m = NETWORKS["alexnet_v2"].build(1000, 224)
    assert m.count_params() > 50_000_000  # Slim alexnet_v2 has ~50M parameters
    assert NETWORKS["vgg_a"].build(1000, 224).count_params() > 130_000_000


@pytest.mark.parametrize("name", ["tiny", "alexnet_v2"])
def test_one_training_step_changes_the_loss(name):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 64, 64, 3)).astype(np.float32), rng.integers(0, 5, 4)
    c = TrainConsumer(name, 5, 64, lr=0.05, seed=1)
    losses = [c.step(x, y)["loss"] for _ in range(3)]
    assert all(np.isfinite(losses)) and len(set(losses)) > 1


@pytest.mark.parametrize("name", ["tiny", "mobilenet_v2"])
def test_members_differ_by_seed_and_a_seed_repeats(name):
    a, a2, b = (NETWORKS[name].build(5, 32, seed=s).get_weights()[0] for s in (1, 1, 2))
    assert not np.array_equal(a, b) and np.array_equal(a, a2)


def test_heterogeneous_networks_differ_in_size():
    """FLEET's ensembles need members whose costs differ widely: at 1000 classes ResNet-50 has
    25.6M parameters and MobileNetV2 3.5M (and about 4.1 against 0.3 GFLOPs per image, ~13x)."""
    r, m = (NETWORKS[k].build(1000, 224).count_params() for k in ("resnet_50", "mobilenet_v2"))
    assert 24e6 < r < 27e6 and 3e6 < m < 4e6


@pytest.mark.timing
def test_emulated_waits_without_cpu():
    import time

    c = EmulatedConsumer(rate=100.0)
    t, cpu = time.perf_counter(), time.process_time()
    c.step(np.zeros((20, 2, 2, 3)), np.zeros(20))
    assert time.perf_counter() - t >= 0.19 and time.process_time() - cpu < 0.05
    assert c.emulated and not PeakConsumer().emulated
