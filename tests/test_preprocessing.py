import numpy as np
import pytest
import tensorflow as tf

from enspipe.data.preprocessing import VGG_MEANS, make_preprocess_fn
from enspipe.data.synthetic import synthetic_image


@pytest.fixture(scope="module")
def jpeg():
    return tf.io.encode_jpeg(synthetic_image(0, 1, 10)[0], quality=90)


@pytest.mark.parametrize("name", ["inception", "vgg", "standard", "standard-jitter"])
@pytest.mark.parametrize("size", [32, 64])
def test_shape_and_range(jpeg, name, size):
    from enspipe.data.pixels import OUTPUT_RANGE

    out = make_preprocess_fn(name, size)(jpeg, tf.constant([1, 2], tf.int64)).numpy()
    assert out.shape == (size, size, 3) and out.dtype == np.float32
    lo, hi = OUTPUT_RANGE[name]
    assert out.min() >= lo - 1e-3 and out.max() <= hi + 1e-3
    if name == "vgg":
        assert lo == -max(VGG_MEANS) and hi == 255 - min(VGG_MEANS)


def test_the_standard_crop_is_torchvisions_random_resized_crop():
    """Every box of both backends lies in the image, covers 8-100% of it with an aspect ratio in
    3/4-4/3 (up to rounding), or is torchvision's central fallback where no attempt fits."""
    from enspipe.data import pixels
    from enspipe.data.preprocessing import _resized_crop_box

    for w0, h0 in ((400, 300), (500, 120), (64, 64)):
        boxes = [pixels.resized_crop_box(pixels.generator(0, i), w0, h0) for i in range(100)]
        for i in range(100):
            (top, left), (h, w) = (x.numpy().tolist() for x in _resized_crop_box(tf.constant([h0, w0]),
                                                                                  tf.constant([3, i], tf.int64)))
            boxes.append((left, top, w, h))
        for left, top, w, h in boxes:
            assert 0 <= left and left + w <= w0 and 0 <= top and top + h <= h0
            fallback = (w, h) in ((w0, min(h0, round(w0 * 4 / 3))), (min(w0, round(h0 * 4 / 3)), h0))
            drawn = 0.08 * w0 * h0 - w - h <= w * h and 3 / 4 - 0.05 <= w / h <= 4 / 3 + 0.05
            assert fallback or drawn, (w0, h0, w, h)


def test_the_standard_normalisation_is_torchvisions():
    from enspipe.data import pixels

    x = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    want = (x / 255.0 - np.array(pixels.IMAGENET_MEAN)) / np.array(pixels.IMAGENET_STD)
    assert np.abs(pixels.to_wire("standard", x, "float32") - want).max() < 1e-5
    lo, hi = pixels.OUTPUT_RANGE["standard"]
    assert np.isclose(lo, -0.485 / 0.229) and np.isclose(hi, (1 - 0.406) / 0.225)


@pytest.mark.parametrize("name", ["inception", "vgg", "standard"])
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


def _map(fn, jpegs: list[bytes], seed: int) -> np.ndarray:
    ds = tf.data.Dataset.from_tensor_slices(tf.constant(jpegs)).enumerate()
    ds = ds.map(lambda i, e: fn(e, tf.stack([tf.constant(seed, tf.int64), i])), num_parallel_calls=2)
    return np.stack([x.numpy() for x in ds])


@pytest.fixture(scope="module")
def both_sets():
    """Every image of both sets: the embedded dataset's first 256 JPEGs and 160 photo crops (4:2:0,
    4:4:4, progressive, grey)."""
    from enspipe.data.photos import photo_jpegs
    from enspipe.data.synthetic import synthetic_jpeg

    return {"synthetic": [synthetic_jpeg(0, i)[0] for i in range(256)], "photos": [j for _, j in photo_jpegs(160)]}


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize("images", ["synthetic", "photos"])
def test_crop_first_is_the_reference_bit_for_bit(both_sets, images, fast_mode):
    """inception's crop-first path (the crop window alone decoded, the crop alone made float) gives
    Slim's functions' values exactly, on every image: the window's edge columns too, where
    libjpeg-turbo's cropped decode alone would differ."""
    jpegs = both_sets[images]
    ref = _map(make_preprocess_fn("inception", 224, fast_mode, "reference"), jpegs, 11)
    crop_first = _map(make_preprocess_fn("inception", 224, fast_mode, "crop-first"), jpegs, 11)
    assert ref.shape == (len(jpegs), 224, 224, 3)
    differ = [i for i in range(len(jpegs)) if not np.array_equal(ref[i], crop_first[i])]
    assert not differ, f"{len(differ)} images differ, the first {differ[:5]} by {np.abs(ref - crop_first).max()}"


def test_the_margin_is_what_makes_the_window_exact(both_sets, monkeypatch):
    """Without decoding a margin around the window, libjpeg-turbo's fancy upsampling differs in the
    window's edge columns: the test above would catch a path that lost it."""
    from enspipe.data import preprocessing

    monkeypatch.setattr(preprocessing, "_JPEG_MARGIN", 0)
    jpegs = both_sets["synthetic"][:64]
    ref = _map(make_preprocess_fn("inception", 224, False, "reference"), jpegs, 11)
    crop_first = _map(make_preprocess_fn("inception", 224, False, "crop-first"), jpegs, 11)
    assert sum(not np.array_equal(a, b) for a, b in zip(ref, crop_first)) > 0


def test_png_takes_the_whole_decode():
    from PIL import Image
    import io

    buf = io.BytesIO()
    Image.fromarray(synthetic_image(0, 2, 10)[0]).save(buf, "PNG")
    png = [buf.getvalue()] * 4
    ref = _map(make_preprocess_fn("inception", 64, False, "reference"), png, 1)
    assert np.array_equal(ref, _map(make_preprocess_fn("inception", 64, False, "crop-first"), png, 1))


def test_unknown_implementation():
    with pytest.raises(ValueError, match="unknown preprocessing implementation"):
        make_preprocess_fn("inception", 32, impl="fast")


def test_the_fused_colour_map_is_slims_affine_steps_and_keeps_luma():
    """colour_map: brightness and contrast fuse exactly (they are affine); saturation 1 and hue 0
    are the identity; a hue turn keeps YIQ's luma, as DALI's Hsv does."""
    from enspipe.data.pixels import YIQ, colour_map

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (3, 500))
    means = x.mean(axis=1, keepdims=True)
    a, b = colour_map("bc", {"b": 0.1, "c": 1.3}, means)
    y = x + 0.1
    y = (y - y.mean(axis=1, keepdims=True)) * 1.3 + y.mean(axis=1, keepdims=True)
    assert np.allclose(a @ x + b, y)
    a, b = colour_map("sh", {"s": 1.0, "h": 0.0}, means)
    assert np.allclose(a, np.eye(3)) and np.allclose(b, 0)
    a, b = colour_map("h", {"h": 0.15}, means)
    assert np.allclose(YIQ[0] @ (a @ x + b), YIQ[0] @ x) and not np.allclose(a @ x, x)


def test_fused_colour_is_an_approximation_and_is_refused_beside_a_function(tmp_path):
    from enspipe.plan.errors import ConfigError
    from enspipe.engine.config import StreamConfig

    jpeg = tf.io.encode_jpeg(synthetic_image(0, 3, 10)[0], quality=90)
    seed = tf.constant([1, 4], tf.int64)
    exact = make_preprocess_fn("inception", 64)(jpeg, seed).numpy()
    fused = make_preprocess_fn("inception", 64, impl="fused-colour")(jpeg, seed).numpy()
    assert fused.shape == exact.shape and fused.min() >= -1 and fused.max() <= 1
    assert not np.array_equal(fused, exact)
    with pytest.raises(ConfigError, match="preprocess_impl"):
        StreamConfig(data=str(tmp_path), batch_size=8, preprocess=lambda image, seed: image,
                     preprocess_impl="fused-colour")
    with pytest.raises(ConfigError, match="preprocess_impl"):
        StreamConfig(data=str(tmp_path), batch_size=8, preprocess_impl="reference", backend="pillow")


@pytest.mark.parametrize("op, value", [("b", 0.1), ("b", -0.12), ("c", 0.6), ("c", 1.4), ("s", 0.5), ("s", 1.5),
                                       ("h", 0.15), ("h", -0.2)])
def test_the_pillow_backends_colour_steps_are_tensorflows(op, value):
    """Each colour step of the pillow backend (float32; OpenCV's HSV) against TensorFlow's
    adjust_* op on the same float image: Slim's steps, within float rounding."""
    from enspipe.data import pixels

    x = np.random.default_rng(1).random((24, 24, 3)).astype(np.float32)
    tf_op = {"b": tf.image.adjust_brightness, "c": tf.image.adjust_contrast, "s": tf.image.adjust_saturation,
             "h": tf.image.adjust_hue}[op]
    assert np.abs(pixels.colour_op(x, op, value) - tf_op(x, value).numpy()).max() < 2e-3
