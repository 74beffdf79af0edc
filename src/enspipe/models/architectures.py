"""Keras definitions of the paper's TF-Slim networks: alexnet_v2, inception_v1, vgg_a (+ a tiny test
net); :mod:`enspipe.models.networks` registers them (and is cheap to import: this module imports Keras).

Layer shapes, paddings and initialisers follow ``tf-models/research/slim/nets``. At the paper's
224 px the architectures are exactly Slim's. For smaller test images two Slim-compatible
adaptations keep the graph valid: a VALID pooling whose input is smaller than its window becomes
SAME, and the fully-connected-as-convolution head (``fc6`` / final avg pool) uses the remaining
spatial extent as its kernel (5 or 7 at 224 px, exactly as in Slim).
"""
from __future__ import annotations

import keras
from keras import layers


def _pool(x, size: int, stride: int, padding: str = "valid", kind: str = "max"):
    if padding == "valid" and min(x.shape[1], x.shape[2]) < size:
        padding = "same"
    cls = layers.MaxPooling2D if kind == "max" else layers.AveragePooling2D
    return cls(size, stride, padding=padding)(x)


def _head_kernel(x, kernel: int) -> tuple[int, int]:
    return (min(kernel, x.shape[1]), min(kernel, x.shape[2]))


def _classifier(x, num_classes: int, kernel: int, width: int, dropout: float, conv):
    """Slim's fully-connected layers expressed as convolutions, then spatial squeeze."""
    x = conv(x, width, _head_kernel(x, kernel), padding="valid")
    x = layers.Dropout(dropout)(x)
    x = conv(x, width, 1)
    x = layers.Dropout(dropout)(x)
    x = conv(x, num_classes, 1, activation=None, bias=0.0)
    return layers.Flatten()(layers.GlobalAveragePooling2D(keepdims=True)(x))


def _conv_factory(stddev: float, bias: float, seed: int, batch_norm: bool = False):
    counter = iter(range(10_000))

    def conv(x, filters, kernel, stride=1, padding="same", activation="relu", bias=bias):
        s = seed * 10_000 + next(counter)
        x = layers.Conv2D(filters, kernel, stride, padding=padding,
                          use_bias=not (batch_norm and activation),
                          kernel_initializer=keras.initializers.TruncatedNormal(stddev=stddev, seed=s),
                          bias_initializer=keras.initializers.Constant(bias))(x)
        if batch_norm and activation:
            x = layers.BatchNormalization(momentum=0.9997, epsilon=0.001)(x)
        return layers.Activation(activation)(x) if activation else x

    return conv


def alexnet_v2(num_classes: int, image_size: int = 224, seed: int = 0) -> keras.Model:
    conv = _conv_factory(stddev=0.005, bias=0.1, seed=seed)
    inputs = keras.Input((image_size, image_size, 3))
    x = conv(inputs, 64, 11, 4, padding="valid")
    x = _pool(x, 3, 2)
    x = conv(x, 192, 5)
    x = _pool(x, 3, 2)
    x = conv(x, 384, 3)
    x = conv(x, 384, 3)
    x = conv(x, 256, 3)
    x = _pool(x, 3, 2)
    return keras.Model(inputs, _classifier(x, num_classes, 5, 4096, 0.5, conv), name="alexnet_v2")


def vgg_a(num_classes: int, image_size: int = 224, seed: int = 0) -> keras.Model:
    conv = _conv_factory(stddev=0.01, bias=0.0, seed=seed)
    inputs = keras.Input((image_size, image_size, 3))
    x = inputs
    for repeats, filters in ((1, 64), (1, 128), (2, 256), (2, 512), (2, 512)):
        for _ in range(repeats):
            x = conv(x, filters, 3)
        x = _pool(x, 2, 2)
    return keras.Model(inputs, _classifier(x, num_classes, 7, 4096, 0.5, conv), name="vgg_a")


_INCEPTION_V1_MIXED = {  # branch widths: 1x1 | 1x1->3x3 | 1x1->3x3 | pool->1x1 (Slim uses 3x3 in branch 2)
    "3b": (64, 96, 128, 16, 32, 32), "3c": (128, 128, 192, 32, 96, 64),
    "4b": (192, 96, 208, 16, 48, 64), "4c": (160, 112, 224, 24, 64, 64),
    "4d": (128, 128, 256, 24, 64, 64), "4e": (112, 144, 288, 32, 64, 64),
    "4f": (256, 160, 320, 32, 128, 128),
    "5b": (256, 160, 320, 32, 128, 128), "5c": (384, 192, 384, 48, 128, 128),
}


def inception_v1(num_classes: int, image_size: int = 224, seed: int = 0) -> keras.Model:
    conv = _conv_factory(stddev=0.01, bias=0.0, seed=seed, batch_norm=True)

    def mixed(x, name):
        b0, b1a, b1b, b2a, b2b, b3 = _INCEPTION_V1_MIXED[name]
        branches = [
            conv(x, b0, 1),
            conv(conv(x, b1a, 1), b1b, 3),
            conv(conv(x, b2a, 1), b2b, 3),
            conv(_pool(x, 3, 1, "same"), b3, 1),
        ]
        return layers.Concatenate(axis=3)(branches)

    inputs = keras.Input((image_size, image_size, 3))
    x = conv(inputs, 64, 7, 2)
    x = _pool(x, 3, 2, "same")
    x = conv(x, 64, 1)
    x = conv(x, 192, 3)
    x = _pool(x, 3, 2, "same")
    x = mixed(mixed(x, "3b"), "3c")
    x = _pool(x, 3, 2, "same")
    for name in ("4b", "4c", "4d", "4e", "4f"):
        x = mixed(x, name)
    x = _pool(x, 2, 2, "same")
    x = mixed(mixed(x, "5b"), "5c")
    x = layers.AveragePooling2D(_head_kernel(x, 7), 1, padding="valid")(x)
    x = layers.Dropout(0.2)(x)
    x = conv(x, num_classes, 1, activation=None)
    return keras.Model(inputs, layers.Flatten()(layers.GlobalAveragePooling2D(keepdims=True)(x)),
                       name="inception_v1")


def tiny(num_classes: int, image_size: int = 224, seed: int = 0) -> keras.Model:
    """A two-convolution network for tests: trains in milliseconds on a CPU."""
    conv = _conv_factory(stddev=0.1, bias=0.0, seed=seed)
    inputs = keras.Input((image_size, image_size, 3))
    x = conv(conv(inputs, 8, 3, 2), 16, 3, 2)
    x = layers.GlobalAveragePooling2D()(x)
    out = layers.Dense(num_classes, kernel_initializer=keras.initializers.GlorotUniform(seed=seed))(x)
    return keras.Model(inputs, out, name="tiny")


def _application(build, seed: int) -> keras.Model:
    """A ``keras.applications`` model, randomly initialised (``weights=None``) from ``seed``: Keras
    seeds its initialisers from the global generator, so it is seeded first."""
    keras.utils.set_random_seed(seed)
    return build()


def resnet_50(num_classes: int, image_size: int = 224, seed: int = 0) -> keras.Model:
    """ResNet-50 (He et al. 2016) as ``keras.applications.ResNet50``: FLEET's ensembles derive
    from the ResNet family; about 6x alexnet_v2's training cost per image."""
    return _application(lambda: keras.applications.ResNet50(
        weights=None, input_shape=(image_size, image_size, 3), classes=num_classes, classifier_activation=None), seed)


def mobilenet_v2(num_classes: int, image_size: int = 224, seed: int = 0) -> keras.Model:
    """MobileNetV2 (Sandler et al. 2018, width 1.0) as ``keras.applications.MobileNetV2``: the
    cheap end of a heterogeneous ensemble."""
    return _application(lambda: keras.applications.MobileNetV2(
        weights=None, input_shape=(image_size, image_size, 3), classes=num_classes, classifier_activation=None), seed)
