"""The paper's networks in PyTorch (``torch.nn``, no torchvision): TF-Slim's ``alexnet_v2``,
``inception_v1`` (GoogLeNet) and ``vgg_a`` (VGG-11), and the tests' ``tiny``. Each is
``fn(num_classes, image_size, seed) -> torch.nn.Module`` taking NCHW float images, with the layers
of :mod:`enspipe.models.architectures` (the Keras definitions, after ``tf-models/research/slim/nets``):
the same widths, kernels, strides and paddings, batch normalisation in inception_v1, and Slim's
fully-connected layers as convolutions (kernel 5 or 7 at 224 px). The same two adaptations keep
small test images valid: a VALID pooling whose input is smaller than its window pads (as SAME),
and the head's first kernel is at most the remaining spatial extent. Initialisation is PyTorch's
default, seeded.
"""
from __future__ import annotations


def _modules():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Pool(nn.Module):
        """Max pooling, VALID (or SAME: ``same``); VALID over an input smaller than the window pads."""

        def __init__(self, k: int, s: int, same: bool = False):
            super().__init__()
            self.k, self.s, self.same = k, s, same

        def forward(self, x):
            if self.same or min(x.shape[-2:]) < self.k:
                if self.k % 2:  # odd window: k // 2 each side gives ceil(in / s)
                    return F.max_pool2d(x, self.k, self.s, padding=self.k // 2)
                return F.max_pool2d(x, self.k, self.s, ceil_mode=True)
            return F.max_pool2d(x, self.k, self.s)

    class Mixed(nn.Module):
        """An inception module: 1x1 | 1x1 -> 3x3 | 1x1 -> 3x3 | 3x3 max pool -> 1x1, concatenated."""

        def __init__(self, cin: int, widths: tuple[int, ...], conv):
            super().__init__()
            b0, b1a, b1b, b2a, b2b, b3 = widths
            self.branches = nn.ModuleList([
                conv(cin, b0, 1), nn.Sequential(conv(cin, b1a, 1), conv(b1a, b1b, 3)),
                nn.Sequential(conv(cin, b2a, 1), conv(b2a, b2b, 3)), nn.Sequential(Pool(3, 1, True), conv(cin, b3, 1))])
            self.width = b0 + b1b + b2b + b3

        def forward(self, x):
            return torch.cat([b(x) for b in self.branches], dim=1)

    return torch, nn, Pool, Mixed


def _conv_factory(nn, batch_norm: bool = False):
    def conv(cin: int, cout: int, k, stride: int = 1, valid: bool = False, relu: bool = True):
        kk = k if isinstance(k, tuple) else (k, k)
        pad = 0 if valid else (kk[0] // 2, kk[1] // 2)
        layers = [nn.Conv2d(cin, cout, kk, stride, padding=pad, bias=not (batch_norm and relu))]
        if batch_norm and relu:
            layers.append(nn.BatchNorm2d(cout, eps=0.001, momentum=0.0003))  # Slim's decay 0.9997
        if relu:
            layers.append(nn.ReLU(inplace=True))
        return nn.Sequential(*layers)

    return conv


def _extent(torch, features, image_size: int) -> tuple[int, int]:
    """The features' output height and width for one image (inference mode: batch norm's statistics
    are not touched)."""
    features.eval()
    with torch.no_grad():
        h, w = features(torch.zeros(1, 3, image_size, image_size)).shape[-2:]
    features.train()
    return int(h), int(w)


def _slim_head(torch, nn, conv, features, cin: int, image_size: int, kernel: int, width: int, dropout: float,
               num_classes: int):
    """Slim's fully-connected layers as convolutions, then the spatial squeeze."""
    h, w = _extent(torch, features, image_size)
    return nn.Sequential(features, conv(cin, width, (min(kernel, h), min(kernel, w)), valid=True), nn.Dropout(dropout),
                         conv(width, width, 1), nn.Dropout(dropout), conv(width, num_classes, 1, relu=False),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


def alexnet_v2(num_classes: int, image_size: int = 224, seed: int = 0):
    """Slim's alexnet_v2: conv 64/11 s4 VALID, pool, 192/5, pool, 384/3, 384/3, 256/3, pool, then
    fc6 (4096, 5x5), fc7 (4096), fc8 as convolutions with dropout 0.5."""
    torch, nn, Pool, _ = _modules()
    torch.manual_seed(seed)
    conv = _conv_factory(nn)
    features = nn.Sequential(conv(3, 64, 11, 4, valid=True), Pool(3, 2), conv(64, 192, 5), Pool(3, 2),
                             conv(192, 384, 3), conv(384, 384, 3), conv(384, 256, 3), Pool(3, 2))
    return _slim_head(torch, nn, conv, features, 256, image_size, 5, 4096, 0.5, num_classes)


def vgg_a(num_classes: int, image_size: int = 224, seed: int = 0):
    """Slim's vgg_a (VGG-11): 64, pool, 128, pool, 2x256, pool, 2x512, pool, 2x512, pool (3x3
    convolutions), then fc6 (4096, 7x7), fc7 (4096), fc8 as convolutions with dropout 0.5."""
    torch, nn, Pool, _ = _modules()
    torch.manual_seed(seed)
    conv = _conv_factory(nn)
    layers, cin = [], 3
    for repeats, filters in ((1, 64), (1, 128), (2, 256), (2, 512), (2, 512)):
        for _ in range(repeats):
            layers.append(conv(cin, filters, 3))
            cin = filters
        layers.append(Pool(2, 2))
    return _slim_head(torch, nn, conv, nn.Sequential(*layers), 512, image_size, 7, 4096, 0.5, num_classes)


_MIXED = {  # Slim's branch widths: 1x1 | 1x1->3x3 | 1x1->3x3 | pool->1x1
    "3b": (64, 96, 128, 16, 32, 32), "3c": (128, 128, 192, 32, 96, 64),
    "4b": (192, 96, 208, 16, 48, 64), "4c": (160, 112, 224, 24, 64, 64),
    "4d": (128, 128, 256, 24, 64, 64), "4e": (112, 144, 288, 32, 64, 64), "4f": (256, 160, 320, 32, 128, 128),
    "5b": (256, 160, 320, 32, 128, 128), "5c": (384, 192, 384, 48, 128, 128),
}


def inception_v1(num_classes: int, image_size: int = 224, seed: int = 0):
    """Slim's inception_v1 (GoogLeNet, batch-normalised): the stem, mixed 3b..5c with pools
    between, a 7x7 average pool, dropout 0.2 and the 1x1 classifier."""
    torch, nn, Pool, Mixed = _modules()
    torch.manual_seed(seed)
    conv = _conv_factory(nn, batch_norm=True)
    layers = [conv(3, 64, 7, 2), Pool(3, 2, True), conv(64, 64, 1), conv(64, 192, 3), Pool(3, 2, True)]
    cin = 192
    for name in ("3b", "3c", "pool3", "4b", "4c", "4d", "4e", "4f", "pool2", "5b", "5c"):
        if name.startswith("pool"):
            layers.append(Pool(int(name[-1]), 2, True))
            continue
        layers.append(Mixed(cin, _MIXED[name], conv))
        cin = layers[-1].width
    features = nn.Sequential(*layers)
    h, w = _extent(torch, features, image_size)
    return nn.Sequential(features, nn.AvgPool2d((min(7, h), min(7, w)), 1), nn.Dropout(0.2),
                         conv(cin, num_classes, 1, relu=False), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def tiny(num_classes: int, image_size: int = 224, seed: int = 0):
    """A two-convolution network for tests: trains in milliseconds on a CPU."""
    torch, nn, _, _ = _modules()
    torch.manual_seed(seed)
    conv = _conv_factory(nn)
    return nn.Sequential(conv(3, 8, 3, 2), conv(8, 16, 3, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, num_classes))


TORCH_NETWORKS = {"alexnet_v2": alexnet_v2, "inception_v1": inception_v1, "vgg_a": vgg_a, "tiny": tiny}
