"""Users' own augmentations for tests/test_transforms.py (the workers import this module by the
member's import path): a numpy callable, a kornia pipeline (a torch module, so it gets uint8
tensors), a torchvision v2 pipeline, and three that must be refused before any work."""
import numpy as np


def crop_flip(image):
    """A random 24 x 24 crop, flipped half the time, by numpy's global generator."""
    h, w = image.shape[:2]
    top, left = np.random.randint(0, h - 23), np.random.randint(0, w - 23)
    out = image[top:top + 24, left:left + 24]
    return out[:, ::-1] if np.random.rand() < 0.5 else out


try:
    import torch

    class ToFloat(torch.nn.Module):
        """uint8 to [0, 1] floats, as kornia's augmentations take them (a module's top level: pickled by name)."""

        def forward(self, x):
            return x.float() / 255
except ImportError:  # TensorFlow's environment: these tests skip
    torch = None


def kornia_pipeline():
    import kornia.augmentation as K

    return torch.nn.Sequential(ToFloat(), K.RandomResizedCrop((20, 20), keepdim=True),
                               K.RandomHorizontalFlip(keepdim=True), K.ColorJitter(0.2, 0.2, 0.2, keepdim=True))


def torchvision_pipeline():
    import torch
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(20, antialias=True), v2.RandomHorizontalFlip(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)])


def fails(image):
    raise KeyError("no such lookup table")


def changing(image):
    return image[:np.random.randint(10, 20)]


def text(image):
    return np.array(["a", "b"])
