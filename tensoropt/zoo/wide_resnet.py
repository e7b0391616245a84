"""Wide ResNet (Zagoruyko & Komodakis 2016) in torchvision's ``wide_resnet50_2`` form.

A ResNet (He et al. 2016) whose bottleneck blocks have ``width`` times the usual inner channels
(``width_per_group = 64 * width``); depths 50/101/152 use bottleneck blocks, 18/34 use basic blocks
whose first convolution is widened the same way.  NetSplit (thesis §6.2.1) trains WRN-152-2 on
ImageNet 224x224 with batch 64, and uses it as DeepLab-V3's encoder (see :mod:`.deeplab`), which
is why :class:`ResNetBackbone` supports dilation.
"""

from __future__ import annotations

from torch import nn

from ._base import ZooModel, check, images

# depth -> (bottleneck?, blocks per stage)
LAYOUTS = {
    18: (False, (2, 2, 2, 2)),
    34: (False, (3, 4, 6, 3)),
    50: (True, (3, 4, 6, 3)),
    101: (True, (3, 4, 23, 3)),
    152: (True, (3, 8, 36, 3)),
}


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    padding = dilation * (kernel - 1) // 2
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, padding, dilation=dilation, bias=False),
        nn.BatchNorm2d(cout),
    )


class Block(nn.Module):
    """Bottleneck (1x1, 3x3, 1x1; expansion 4) or basic (3x3, 3x3) residual block."""

    def __init__(self, cin: int, planes: int, width: int, bottleneck: bool,
                 stride: int, dilation: int, first_dilation: int):
        super().__init__()
        inner = planes * width
        self.out_channels = planes * 4 if bottleneck else planes
        if bottleneck:
            convs = [conv_bn(cin, inner, 1),
                     conv_bn(inner, inner, 3, stride, first_dilation),
                     conv_bn(inner, self.out_channels, 1)]
        else:
            convs = [conv_bn(cin, inner, 3, stride, first_dilation),
                     conv_bn(inner, self.out_channels, 3, 1, dilation)]
        self.convs = nn.ModuleList(convs)
        self.relu = nn.ReLU()
        self.downsample = (conv_bn(cin, self.out_channels, 1, stride)
                           if stride != 1 or cin != self.out_channels else nn.Identity())

    def forward(self, x):
        out = x
        for i, conv in enumerate(self.convs):
            out = conv(out)
            if i < len(self.convs) - 1:
                out = self.relu(out)
        return self.relu(out + self.downsample(x))


class ResNetBackbone(nn.Module):
    """Stem and four stages; returns the last feature map.

    ``dilate`` says, per stage 2..4, whether to replace its stride by dilation (as torchvision's
    ``replace_stride_with_dilation``), which DeepLab uses for output stride 8 or 16.
    """

    def __init__(self, depth: int, width: int, base_channels: int = 64,
                 dilate: tuple[bool, bool, bool] = (False, False, False)):
        super().__init__()
        bottleneck, counts = LAYOUTS[depth]
        self.stem = nn.Sequential(conv_bn(3, base_channels, 7, 2), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        channels, dilation = base_channels, 1
        stages = []
        for i, count in enumerate(counts):
            planes = base_channels * 2 ** i
            stride = 1 if i == 0 else 2
            first_dilation = dilation
            if i > 0 and dilate[i - 1]:
                dilation *= stride
                stride = 1
            blocks = []
            for j in range(count):
                block = Block(channels, planes, width, bottleneck,
                              stride if j == 0 else 1, dilation,
                              first_dilation if j == 0 else dilation)
                channels = block.out_channels
                blocks.append(block)
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.out_channels = channels

    def forward(self, x):
        return self.stages(self.stem(x))


class WideResNet(nn.Module):
    def __init__(self, depth: int, width: int, num_classes: int, base_channels: int = 64):
        super().__init__()
        self.backbone = ResNetBackbone(depth, width, base_channels)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(self.backbone.out_channels, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.backbone(x)).flatten(1))


def check_depth(depth: int) -> None:
    check(depth in LAYOUTS, f"depth must be one of {sorted(LAYOUTS)}, got {depth}")


def build_wide_resnet(*, batch: int = 64, depth: int = 50, width: int = 2, image_size: int = 224,
                      num_classes: int = 1000, base_channels: int = 64):
    """WRN-``depth``-``width``; depth 50 and width 2 is torchvision's ``wide_resnet50_2``."""
    check_depth(depth)
    check(image_size >= 32, f"image_size must be at least 32 (overall stride 32), got {image_size}")
    return WideResNet(depth, width, num_classes, base_channels), images(batch, image_size)


def build_wide_resnet152(*, batch: int = 64, width: int = 2, image_size: int = 224,
                         num_classes: int = 1000, base_channels: int = 64):
    """WRN-152-``width``, NetSplit's image classifier."""
    return build_wide_resnet(batch=batch, depth=152, width=width, image_size=image_size,
                             num_classes=num_classes, base_channels=base_channels)


ENTRIES = (
    ZooModel(
        name="wide_resnet",
        description="Wide ResNet (default WRN-50-2, 69M params), depth 18/34/50/101/152",
        build=build_wide_resnet,
        tiny={"batch": 2, "depth": 50, "image_size": 32, "num_classes": 10, "base_channels": 4},
        source="Zagoruyko & Komodakis 2016 / torchvision wide_resnet50_2; ImageNet 224x224, "
               "batch 64 as NetSplit thesis §6.2.1",
    ),
    ZooModel(
        name="wide_resnet152",
        description="WRN-152-2 image classifier (175M params), 224x224 ImageNet",
        build=build_wide_resnet152,
        tiny={"batch": 2, "image_size": 32, "num_classes": 10, "base_channels": 4},
        source="NetSplit thesis §6.2.1: WRN-152-2, ImageNet 224x224, batch 64",
    ),
)
