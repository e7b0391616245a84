"""U-Net (Ronneberger et al. 2015) for semantic segmentation.

Four down steps (2x2 max pool, two 3x3 conv-BN-ReLU) and four up steps (2x2 transposed
convolution, or bilinear upsampling with halved channels, then concatenation with the skip
connection and two 3x3 conv-BN-ReLU), as in the widely used milesial/Pytorch-UNet.  Padded
convolutions keep the output at the input's size.  NetSplit (thesis §6.2.1) trains it on
PASCAL VOC2012 segmentation (21 classes) at 224x224 with batch 128.
"""

from __future__ import annotations

import torch
from torch import nn

from ._base import ZooModel, check, images


def double_conv(cin: int, cout: int, mid: int | None = None) -> nn.Sequential:
    mid = mid or cout
    return nn.Sequential(
        nn.Conv2d(cin, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
        nn.Conv2d(mid, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
    )


class Up(nn.Module):
    """Upsample ``x`` by 2, concatenate the skip connection, two 3x3 convolutions."""

    def __init__(self, cin: int, cout: int, bilinear: bool):
        super().__init__()
        self.up: nn.Module
        if bilinear:
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            self.conv = double_conv(cin, cout, cin // 2)
        else:
            self.up = nn.ConvTranspose2d(cin, cin // 2, 2, stride=2)
            self.conv = double_conv(cin, cout)

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    def __init__(self, num_classes: int, base_channels: int, bilinear: bool):
        super().__init__()
        c = base_channels
        factor = 2 if bilinear else 1
        self.inc = double_conv(3, c)
        self.downs = nn.ModuleList([
            nn.Sequential(nn.MaxPool2d(2), double_conv(c, 2 * c)),
            nn.Sequential(nn.MaxPool2d(2), double_conv(2 * c, 4 * c)),
            nn.Sequential(nn.MaxPool2d(2), double_conv(4 * c, 8 * c)),
            nn.Sequential(nn.MaxPool2d(2), double_conv(8 * c, 16 * c // factor)),
        ])
        self.ups = nn.ModuleList([
            Up(16 * c, 8 * c // factor, bilinear),
            Up(8 * c, 4 * c // factor, bilinear),
            Up(4 * c, 2 * c // factor, bilinear),
            Up(2 * c, c, bilinear),
        ])
        self.outc = nn.Conv2d(c, num_classes, 1)

    def forward(self, x):
        x = self.inc(x)
        skips = []
        for down in self.downs:
            skips.append(x)
            x = down(x)
        for up, skip in zip(self.ups, reversed(skips)):
            x = up(x, skip)
        return self.outc(x)


def build_unet(*, batch: int = 128, image_size: int = 224, num_classes: int = 21,
               base_channels: int = 64, bilinear: bool = False):
    """U-Net returning ``(batch, num_classes, image_size, image_size)`` logits."""
    check(image_size % 16 == 0, f"image_size must be a multiple of 16 (four 2x2 poolings), "
                                f"got {image_size}")
    check(base_channels % 2 == 0, f"base_channels must be even, got {base_channels}")
    return UNet(num_classes, base_channels, bilinear), images(batch, image_size)


ENTRIES = (
    ZooModel(
        name="unet",
        description="U-Net semantic segmentation (31M params), VOC2012 21 classes, 224x224",
        build=build_unet,
        tiny={"batch": 2, "image_size": 32, "num_classes": 3, "base_channels": 4},
        source="NetSplit thesis §6.2.1: U-Net on PASCAL VOC2012 segmentation (21 classes), "
               "224x224, batch 128; Ronneberger et al. 2015",
    ),
)
