"""Inception-v3 (Szegedy et al. 2016, "Rethinking the Inception Architecture").

Block structure and channel counts follow torchvision's ``inception_v3``: a convolutional stem,
3x InceptionA (35x35), InceptionB (grid reduction), 4x InceptionC with factorized 1x7/7x1
convolutions (17x17), InceptionD (reduction), 2x InceptionE (8x8), global pooling, dropout and a
linear classifier.  The auxiliary classifier is omitted; ``width`` scales every channel count
(1.0 is the paper's network; the tiny variant uses 1/8).  FastT benchmarks Inception-v3 at
299x299 with batch 64.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ._base import ZooModel, check, images, scaled

Scale = Callable[[int], int]


class ConvBN(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__(nn.Conv2d(cin, cout, kernel, stride, padding, bias=False),
                         nn.BatchNorm2d(cout, eps=0.001), nn.ReLU())


def avg_pool_3x3(x):
    return F.avg_pool2d(x, 3, stride=1, padding=1)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int, s: Scale):
        super().__init__()
        self.b1x1 = ConvBN(cin, s(64), 1)
        self.b5x5 = nn.Sequential(ConvBN(cin, s(48), 1), ConvBN(s(48), s(64), 5, padding=2))
        self.b3x3dbl = nn.Sequential(ConvBN(cin, s(64), 1), ConvBN(s(64), s(96), 3, padding=1),
                                     ConvBN(s(96), s(96), 3, padding=1))
        self.pool = ConvBN(cin, s(pool_features), 1)
        self.out_channels = s(64) + s(64) + s(96) + s(pool_features)

    def forward(self, x):
        return torch.cat([self.b1x1(x), self.b5x5(x), self.b3x3dbl(x),
                          self.pool(avg_pool_3x3(x))], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int, s: Scale):
        super().__init__()
        self.b3x3 = ConvBN(cin, s(384), 3, stride=2)
        self.b3x3dbl = nn.Sequential(ConvBN(cin, s(64), 1), ConvBN(s(64), s(96), 3, padding=1),
                                     ConvBN(s(96), s(96), 3, stride=2))
        self.out_channels = s(384) + s(96) + cin

    def forward(self, x):
        return torch.cat([self.b3x3(x), self.b3x3dbl(x), F.max_pool2d(x, 3, stride=2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int, s: Scale):
        super().__init__()
        c7, c192 = s(c7), s(192)
        self.b1x1 = ConvBN(cin, c192, 1)
        self.b7x7 = nn.Sequential(ConvBN(cin, c7, 1), ConvBN(c7, c7, (1, 7), padding=(0, 3)),
                                  ConvBN(c7, c192, (7, 1), padding=(3, 0)))
        self.b7x7dbl = nn.Sequential(
            ConvBN(cin, c7, 1), ConvBN(c7, c7, (7, 1), padding=(3, 0)),
            ConvBN(c7, c7, (1, 7), padding=(0, 3)), ConvBN(c7, c7, (7, 1), padding=(3, 0)),
            ConvBN(c7, c192, (1, 7), padding=(0, 3)))
        self.pool = ConvBN(cin, c192, 1)
        self.out_channels = 4 * c192

    def forward(self, x):
        return torch.cat([self.b1x1(x), self.b7x7(x), self.b7x7dbl(x),
                          self.pool(avg_pool_3x3(x))], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int, s: Scale):
        super().__init__()
        c192 = s(192)
        self.b3x3 = nn.Sequential(ConvBN(cin, c192, 1), ConvBN(c192, s(320), 3, stride=2))
        self.b7x7x3 = nn.Sequential(
            ConvBN(cin, c192, 1), ConvBN(c192, c192, (1, 7), padding=(0, 3)),
            ConvBN(c192, c192, (7, 1), padding=(3, 0)), ConvBN(c192, c192, 3, stride=2))
        self.out_channels = s(320) + c192 + cin

    def forward(self, x):
        return torch.cat([self.b3x3(x), self.b7x7x3(x), F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int, s: Scale):
        super().__init__()
        c384 = s(384)
        self.b1x1 = ConvBN(cin, s(320), 1)
        self.b3x3 = ConvBN(cin, c384, 1)
        self.b3x3_a = ConvBN(c384, c384, (1, 3), padding=(0, 1))
        self.b3x3_b = ConvBN(c384, c384, (3, 1), padding=(1, 0))
        self.b3x3dbl = nn.Sequential(ConvBN(cin, s(448), 1), ConvBN(s(448), c384, 3, padding=1))
        self.b3x3dbl_a = ConvBN(c384, c384, (1, 3), padding=(0, 1))
        self.b3x3dbl_b = ConvBN(c384, c384, (3, 1), padding=(1, 0))
        self.pool = ConvBN(cin, s(192), 1)
        self.out_channels = s(320) + 4 * c384 + s(192)

    def forward(self, x):
        b3 = self.b3x3(x)
        dbl = self.b3x3dbl(x)
        return torch.cat([self.b1x1(x), self.b3x3_a(b3), self.b3x3_b(b3),
                          self.b3x3dbl_a(dbl), self.b3x3dbl_b(dbl),
                          self.pool(avg_pool_3x3(x))], 1)


class InceptionV3(nn.Module):
    def __init__(self, num_classes: int, width: float):
        super().__init__()
        s = partial(scaled, width=width)
        self.stem = nn.Sequential(
            ConvBN(3, s(32), 3, stride=2), ConvBN(s(32), s(32), 3),
            ConvBN(s(32), s(64), 3, padding=1), nn.MaxPool2d(3, 2),
            ConvBN(s(64), s(80), 1), ConvBN(s(80), s(192), 3), nn.MaxPool2d(3, 2),
        )
        blocks: list[nn.Module] = []
        channels = s(192)
        for make in (partial(InceptionA, pool_features=32), partial(InceptionA, pool_features=64),
                     partial(InceptionA, pool_features=64), InceptionB,
                     partial(InceptionC, c7=128), partial(InceptionC, c7=160),
                     partial(InceptionC, c7=160), partial(InceptionC, c7=192),
                     InceptionD, InceptionE, InceptionE):
            blocks.append(make(channels, s=s))
            channels = int(blocks[-1].out_channels)  # type: ignore[arg-type]  # nn.Module's __getattr__ is untyped
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(self.dropout(x.flatten(1)))


def build_inception_v3(*, batch: int = 64, image_size: int = 299, num_classes: int = 1000,
                       width: float = 1.0):
    """Inception-v3 without the auxiliary head; ``width`` multiplies every channel count."""
    check(image_size >= 75, f"image_size must be at least 75, got {image_size}")
    check(width > 0, f"width must be positive, got {width}")
    return InceptionV3(num_classes, width), images(batch, image_size)


ENTRIES = (
    ZooModel(
        name="inception_v3",
        description="Inception-v3 image classifier (24M params, no aux head), 299x299 ImageNet",
        build=build_inception_v3,
        tiny={"batch": 2, "image_size": 75, "num_classes": 10, "width": 0.125},
        source="FastT benchmarks Inception-v3: ImageNet 299x299, batch 64; "
               "Szegedy et al. 2016 / torchvision inception_v3",
    ),
)
