"""The registered networks: the paper's TF-Slim alexnet_v2, inception_v1 and vgg_a, ResNet-50 and
MobileNetV2 for heterogeneous ensembles (+ a tiny test net), each with its paper batch size and its preprocessing. Importing this module is cheap (no
Keras), so options can be checked before any heavy work; ``build`` imports the Keras definitions
(:mod:`enspipe.models.architectures`) when a model is really needed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from enspipe.common.plugins import FUNCTION_NAME as USER_NETWORK, NotLoadable, load_function

USER_DEFAULTS = {"batch_size": 32, "preprocessing": "inception"}  # the TF-Slim trainer's default batch


class NetworkError(ValueError):
    """A network name that is neither registered nor an importable factory; ``fix`` says what to do."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}; {fix}")


@dataclass(frozen=True)
class NetworkSpec:
    """A network: its batch size (the paper's) and its preprocessing (Slim's factory mapping);
    ``factory`` is a user's ``fn(num_classes, image_size, seed) -> keras.Model`` (else the
    registered architecture ``enspipe.models.architectures.<name>`` is built)."""

    name: str
    batch_size: int
    preprocessing: str
    factory: Callable | None = None

    def build(self, num_classes: int, image_size: int = 224, seed: int = 0):
        """The Keras model."""
        if self.factory is None:
            from enspipe.models import architectures

            return getattr(architectures, self.name)(num_classes, image_size, seed)
        import keras

        try:
            model = self.factory(num_classes=num_classes, image_size=image_size, seed=seed)
        except Exception as e:  # noqa: BLE001 - the user's code, named
            raise NetworkError(f"network {self.name} raised {type(e).__name__}: {e}",
                               "fix the factory: it is called as fn(num_classes=, image_size=, seed=)") from e
        if not isinstance(model, keras.Model):
            raise NetworkError(f"network {self.name} returned {type(model).__name__}, not a keras.Model",
                               "return the model the member trains")
        return model

    def probe(self, num_classes: int, image_size: int, timeout: float = 600.0) -> None:
        """Build a user's model once in a child process (this one's TensorFlow must stay unstarted
        until its thread pools are sized), so that a factory that raises or returns no
        ``keras.Model`` is named before any MPI work. Raises :class:`NetworkError`."""
        import json
        import os
        import subprocess
        import sys

        if self.factory is None:
            return
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path),
                   CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
        code = ("from enspipe.models.networks import _probe_child; "
                f"_probe_child({self.name!r}, {num_classes}, {image_size})")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode == 0:
            return
        lines = r.stdout.strip().splitlines()
        said = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else \
            {"problem": f"network {self.name}: building it failed ({r.stderr.strip()[-500:]})",
             "fix": "fix the factory: it is called as fn(num_classes=, image_size=, seed=)"}
        raise NetworkError(said["problem"], said["fix"])


def _probe_child(name: str, num_classes: int, image_size: int) -> None:
    """:meth:`NetworkSpec.probe`'s child: build the model, or print why not (JSON) and exit 3."""
    import json
    import sys

    try:
        network_spec(name).build(num_classes, image_size, seed=0)
    except NetworkError as e:
        print(json.dumps({"problem": e.problem, "fix": e.fix}))
        sys.exit(3)


def name_problem(name) -> NetworkError | None:
    """Why ``name`` can name no network (neither registered nor ``package.module:function``), or
    None; nothing is imported."""
    if name in NETWORKS or (isinstance(name, str) and USER_NETWORK.match(name)):
        return None
    return NetworkError(f"unknown network {name!r}", f"choose one of {', '.join(NETWORKS)}, or name your own "
                        "factory as package.module:function")


def network_spec(name: str) -> NetworkSpec:
    """The registered network ``name``, or a user's ``package.module:function`` factory, imported
    now (it may set ``batch_size`` and ``preprocessing`` attributes; else 32 and inception). Raises
    :class:`NetworkError` naming what is wrong."""
    if name in NETWORKS:
        return NETWORKS[name]
    problem = name_problem(name)
    if problem:
        raise problem
    try:
        fn = load_function(name, "network")
    except NotLoadable as e:
        raise NetworkError(e.problem, e.fix) from None
    attrs = {k: getattr(fn, k, v) for k, v in USER_DEFAULTS.items()}
    return NetworkSpec(name, int(attrs["batch_size"]), str(attrs["preprocessing"]), fn)


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
