"""The registered networks: the paper's TF-Slim alexnet_v2, inception_v1 and vgg_a, ResNet-50 and
MobileNetV2 for heterogeneous ensembles (+ a tiny test net), each with its paper batch size and its preprocessing. Importing this module is cheap (no
Keras), so options can be checked before any heavy work; ``build`` imports the Keras definitions
(:mod:`enspipe.models.architectures`) when a model is really needed.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NetworkSpec:
    """A network: its paper batch size and its preprocessing (Slim's factory mapping)."""

    name: str
    batch_size: int
    preprocessing: str

    def build(self, num_classes: int, image_size: int = 224, seed: int = 0):
        """The Keras model (``enspipe.models.architectures.<name>``)."""
        from enspipe.models import architectures

        return getattr(architectures, self.name)(num_classes, image_size, seed)


# Preprocessing per network follows Slim's preprocessing_factory (inception_v1 -> inception, vgg_a ->
# vgg). The factory has no alexnet_v2 entry; the paper's appendix stresses inception's fast_mode for
# its AlexNet runs, so alexnet_v2 uses inception preprocessing, as the original experiments did.
NETWORKS: dict[str, NetworkSpec] = {
    "alexnet_v2": NetworkSpec("alexnet_v2", 128, "inception"),
    "inception_v1": NetworkSpec("inception_v1", 32, "inception"),
    "vgg_a": NetworkSpec("vgg_a", 32, "vgg"),
    # Heterogeneous ensembles (FLEET) mix these with the paper's: keras.applications definitions,
    # the preprocessing Slim's factory maps them to (resnet_v1 -> vgg, mobilenet_v2 -> inception) and
    # the TF-Slim trainer's default batch of 32.
    "resnet_50": NetworkSpec("resnet_50", 32, "vgg"),
    "mobilenet_v2": NetworkSpec("mobilenet_v2", 32, "inception"),
    "tiny": NetworkSpec("tiny", 16, "inception"),
}
