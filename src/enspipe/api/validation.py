"""A validation set for a member's own training loop, preprocessed the way its stream is."""
from __future__ import annotations

import numpy as np

from enspipe.data.validation import load_validation
from enspipe.engine.config import StreamConfig
from enspipe.plan.errors import unknown_keywords


def validation_set(data, preprocess="inception", image_size: int = 224, backend: str = "auto",
                   **unknown) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` of the small dataset at ``data``, in its canonical order, held in memory.

    ``preprocess``: a built-in's name, whose evaluation transform is used (Slim's: a central crop
    and resize, no random distortion), or your own, as :class:`SharedStream` takes it: on the
    pillow backend a torchvision v1 or v2 pipeline, a kornia one or any callable (given what it
    takes, :mod:`enspipe.data.transforms`), on the tf backend a function ``fn(image, seed)``; each
    run with the seed of the sample's position. ``backend``: as :class:`SharedStream`'s (``auto``:
    ``tf`` where TensorFlow is installed and ``preprocess`` is not a torch pipeline, else
    ``pillow``). Each member loads it itself (no collective).

    Example::

        val = enspipe.validation_set("data/val", image_size=128)
        model.fit(stream.dataset(), epochs=5, steps_per_epoch=len(stream), validation_data=val)

        val_images, val_labels = enspipe.validation_set("data/val", preprocess=transforms.Compose([
            transforms.Resize(72), transforms.CenterCrop(64), transforms.ToTensor()]))   # (M, 3, 64, 64)
    """
    unknown_keywords(unknown, ("preprocess", "image_size", "backend"), "validation_set", {"transform": "preprocess"})

    cfg = StreamConfig(data=data, batch_size=1, preprocess=preprocess, image_size=image_size, backend=backend)
    _, preprocessing = cfg.check()
    return load_validation(str(data), preprocessing, image_size, cfg.backend_row.needs_tensorflow)
