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


def center32(image):
    """A numpy callable, channels last (H, W, 3) as Pillow, OpenCV and albumentations give it."""
    h, w = image.shape[:2]
    return image[(h - 32) // 2:(h - 32) // 2 + 32, (w - 32) // 2:(w - 32) // 2 + 32]


def kornia_center():
    import kornia.augmentation as K

    return torch.nn.Sequential(ToFloat(), K.CenterCrop(32, keepdim=True))


# torchvision's v1 and v2 pipelines, deterministic, channels first (C, H, W), as a user's script has
# them (module-level objects: `enspipe serve --preprocess user_transforms:TV1` serves them too)
try:
    import torchvision.transforms as T
    from torchvision.transforms import v2

    TV1 = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])
    TV2 = v2.Compose([v2.ToImage(), v2.Resize(40), v2.CenterCrop(32), v2.ToDtype(torch.float32, scale=True)])
except Exception:  # noqa: BLE001 - not installed (TensorFlow's environment), or a build that does not import
    TV1 = TV2 = None


def tiny(image):
    """An output far smaller than a page: three numbers per image."""
    return image.reshape(-1, 3).mean(axis=0).astype(np.float32)


def ambiguous(image):
    """(3, 32, 3): no channel axis that can be told apart."""
    return image[:3, :32, :3]


_calls = [0]


def fifth_wrong(image):
    """The right shape for the probe's two samples, a wrong one on a worker's fifth image."""
    _calls[0] += 1
    return image[:9, :9] if _calls[0] == 5 else image[:8, :8]
