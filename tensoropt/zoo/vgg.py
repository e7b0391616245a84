"""VGG-16 and VGG-19 (Simonyan & Zisserman 2015, configurations D and E).

Layout as in torchvision's ``vgg16``/``vgg19``: 3x3 convolutions (optionally followed by
BatchNorm), 2x2 max pooling, adaptive 7x7 average pooling and a 4096-4096-classes classifier
with dropout.  ``width`` multiplies every channel count (1.0 is the paper's network; the tiny
variant uses 1/16).  FastT benchmarks VGG-19 at 224x224 with batch 64.
"""

from __future__ import annotations

from torch import nn

from ._base import ZooModel, check, images, scaled

# Output channels of each 3x3 convolution; "M" is a 2x2 max pool.
CONFIGS = {
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
         512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


class VGG(nn.Module):
    def __init__(self, depth: int, num_classes: int, width: float, batch_norm: bool):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in CONFIGS[depth]:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            out = scaled(int(item), width)   # not "M": a channel count
            layers.append(nn.Conv2d(channels, out, 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(out))
            layers.append(nn.ReLU())
            channels = out
        hidden = scaled(4096, width)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, hidden), nn.ReLU(), nn.Dropout(),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(x.flatten(1))


def _build(depth, batch, image_size, num_classes, width, batch_norm):
    check(image_size >= 32, f"image_size must be at least 32 (five 2x2 poolings), got {image_size}")
    check(width > 0, f"width must be positive, got {width}")
    return VGG(depth, num_classes, width, batch_norm), images(batch, image_size)


def build_vgg16(*, batch: int = 64, image_size: int = 224, num_classes: int = 1000,
                width: float = 1.0, batch_norm: bool = False):
    """VGG-16 (configuration D)."""
    return _build(16, batch, image_size, num_classes, width, batch_norm)


def build_vgg19(*, batch: int = 64, image_size: int = 224, num_classes: int = 1000,
                width: float = 1.0, batch_norm: bool = False):
    """VGG-19 (configuration E)."""
    return _build(19, batch, image_size, num_classes, width, batch_norm)


_TINY = {"batch": 2, "image_size": 32, "num_classes": 10, "width": 1 / 16}

ENTRIES = (
    ZooModel(
        name="vgg16",
        description="VGG-16 image classifier (138M params), 224x224 ImageNet",
        build=build_vgg16,
        tiny=_TINY,
        source="Simonyan & Zisserman 2015, config D; ImageNet 224x224, 1000 classes, batch 64 "
               "as FastT's VGG benchmark",
    ),
    ZooModel(
        name="vgg19",
        description="VGG-19 image classifier (144M params), 224x224 ImageNet",
        build=build_vgg19,
        tiny=_TINY,
        source="FastT benchmarks VGG-19: ImageNet 224x224, 1000 classes, batch 64 "
               "(Simonyan & Zisserman 2015, config E)",
    ),
)
