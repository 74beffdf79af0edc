import numpy as np
import pytest
import tensorflow as tf

from enspipe.data.preprocessing import VGG_MEANS, make_preprocess_fn
from enspipe.data.synthetic import synthetic_image


@pytest.fixture(scope="module")
def jpeg():
    return tf.io.encode_jpeg(synthetic_image(0, 1, 10)[0], quality=90)


@pytest.mark.parametrize("name", ["inception", "vgg"])
@pytest.mark.parametrize("size", [32, 64])
def test_shape_and_range(jpeg, name, size):
    out = make_preprocess_fn(name, size)(jpeg, tf.constant([1, 2], tf.int64)).numpy()
    assert out.shape == (size, size, 3) and out.dtype == np.float32
    if name == "inception":
        assert out.min() >= -1.0 and out.max() <= 1.0
    else:
        assert out.min() >= -max(VGG_MEANS) - 1e-3 and out.max() <= 255 - min(VGG_MEANS) + 1e-3


@pytest.mark.parametrize("name", ["inception", "vgg"])
def test_reproducible_under_a_seed(jpeg, name):
    fn = make_preprocess_fn(name, 48)
    a, b = fn(jpeg, tf.constant([5, 9], tf.int64)), fn(jpeg, tf.constant([5, 9], tf.int64))
    c = fn(jpeg, tf.constant([5, 10], tf.int64))
    assert np.array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), c.numpy())


def test_inception_is_random_across_elements(jpeg):
    fn = make_preprocess_fn("inception", 48)
    outs = [fn(jpeg, tf.constant([0, i], tf.int64)).numpy() for i in range(6)]
    assert len({o.tobytes() for o in outs}) == 6


def test_fast_mode_runs(jpeg):
    out = make_preprocess_fn("inception", 32, fast_mode=True)(jpeg, tf.constant([1, 1], tf.int64))
    assert out.shape == (32, 32, 3)


def test_unknown_preprocessing():
    with pytest.raises(ValueError, match="unknown preprocessing"):
        make_preprocess_fn("nope", 32)
