"""DeepLab-V3 (Chen et al. 2017, "Rethinking Atrous Convolution") on a Wide-ResNet encoder.

The encoder is :class:`.wide_resnet.ResNetBackbone` with its last stage (output stride 16) or
last two stages (output stride 8) dilated instead of strided.  The head is ASPP as in the paper
and torchvision's ``DeepLabHead``: a 1x1 convolution, three 3x3 atrous convolutions with rates
6/12/18 at output stride 16 (doubled at output stride 8) and image-level pooling, concatenated,
projected to 256 channels, then a 3x3 convolution and a 1x1 classifier; the logits are
bilinearly upsampled to the input size.  NetSplit (thesis §6.2.1) uses a WRN-152 encoder on
VOC2012 (21 classes) at 224x224 with batch 48.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._base import ZooModel, check, images
from .wide_resnet import ResNetBackbone, check_depth


def conv_bn_relu(cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> nn.Sequential:
    padding = dilation * (kernel - 1) // 2
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, padding=padding, dilation=dilation,
                                   bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class ImagePooling(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.conv = conv_bn_relu(cin, cout)

    def forward(self, x):
        return F.interpolate(self.conv(self.pool(x)), size=x.shape[-2:], mode="bilinear",
                             align_corners=False)


class ASPP(nn.Module):
    def __init__(self, cin: int, rates: tuple[int, int, int], cout: int = 256):
        super().__init__()
        self.branches = nn.ModuleList(
            [conv_bn_relu(cin, cout)]
            + [conv_bn_relu(cin, cout, 3, rate) for rate in rates]
            + [ImagePooling(cin, cout)]
        )
        self.project = nn.Sequential(conv_bn_relu(len(self.branches) * cout, cout),
                                     nn.Dropout(0.5))

    def forward(self, x):
        return self.project(torch.cat([branch(x) for branch in self.branches], dim=1))


class DeepLabV3(nn.Module):
    def __init__(self, num_classes: int, depth: int, width: int, output_stride: int,
                 base_channels: int):
        super().__init__()
        dilate = (False, True, True) if output_stride == 8 else (False, False, True)
        rates = (12, 24, 36) if output_stride == 8 else (6, 12, 18)
        self.backbone = ResNetBackbone(depth, width, base_channels, dilate)
        self.head = nn.Sequential(
            ASPP(self.backbone.out_channels, rates),
            conv_bn_relu(256, 256, 3),
            nn.Conv2d(256, num_classes, 1),
        )

    def forward(self, x):
        logits = self.head(self.backbone(x))
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


def build_deeplab_v3(*, batch: int = 48, image_size: int = 224, num_classes: int = 21,
                     backbone_depth: int = 152, width: int = 2, output_stride: int = 8,
                     base_channels: int = 64):
    """DeepLab-V3 returning ``(batch, num_classes, image_size, image_size)`` logits."""
    check_depth(backbone_depth)
    check(output_stride in (8, 16), f"output_stride must be 8 or 16, got {output_stride}")
    check(image_size >= output_stride,
          f"image_size must be at least output_stride ({output_stride}), got {image_size}")
    model = DeepLabV3(num_classes, backbone_depth, width, output_stride, base_channels)
    return model, images(batch, image_size)


ENTRIES = (
    ZooModel(
        name="deeplab_v3",
        description="DeepLab-V3 (ASPP) on a WRN-152-2 encoder (189M params), VOC2012 21 classes",
        build=build_deeplab_v3,
        tiny={"batch": 2, "image_size": 32, "num_classes": 3, "backbone_depth": 50,
              "base_channels": 4},
        source="NetSplit thesis §6.2.1: DeepLab-V3 with a WRN-152 encoder, PASCAL VOC2012 "
               "(21 classes), 224x224, batch 48; Chen et al. 2017",
    ),
)
