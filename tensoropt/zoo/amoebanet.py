"""AmoebaNet-D (Real et al. 2019, "Regularized Evolution") as used by GPipe.

Follows torchgpipe's ``benchmarks/models/amoebanet`` (kakaobrain), which reproduces the parameter
counts of GPipe's Table 1: the AmoebaNet-D genotype of TensorFlow's reference implementation
(normal cells concatenate states 0/3/4/6, reduction cells 4/5/6), cells whose ten operations
(1x1 and bottlenecked 3x3 convolutions, 1x7-then-7x1 convolutions, 3x3 average/max pooling,
2x2 max pooling, identity) are combined pairwise by addition and then concatenated.  Unlike
torchgpipe, ``max_pool_3x3`` is a real max pool and the classifier pools adaptively.
``num_layers`` normal cells (a multiple of 3) are split into three groups by two reduction
cells; ``num_filters`` sets the width.  NetSplit (thesis §6.2.1) trains AmoebaNet-D with 18
layers on ImageNet 224x224 with batch 64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ._base import ZooModel, check, images


def relu_conv_bn(cin: int, cout: int, kernel=1, stride=1, padding=0) -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), nn.Conv2d(cin, cout, kernel, stride, padding, bias=False),
                         nn.BatchNorm2d(cout))


class FactorizedReduce(nn.Module):
    """Halve the resolution with two offset 1x1 stride-2 convolutions."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.relu = nn.ReLU()
        self.pad = nn.ZeroPad2d((0, 1, 0, 1))
        self.conv1 = nn.Conv2d(cin, cout // 2, 1, stride=2, bias=False)
        self.conv2 = nn.Conv2d(cin, cout - cout // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        x = self.relu(x)
        return self.bn(torch.cat([self.conv1(x), self.conv2(self.pad(x[:, :, 1:, 1:]))], dim=1))


def identity(c: int, stride: int) -> nn.Module:
    return nn.Identity() if stride == 1 else FactorizedReduce(c, c)


def avg_pool_3x3(c: int, stride: int) -> nn.Module:
    return nn.AvgPool2d(3, stride, padding=1, count_include_pad=False)


def max_pool_3x3(c: int, stride: int) -> nn.Module:
    return nn.MaxPool2d(3, stride, padding=1)


def max_pool_2x2(c: int, stride: int) -> nn.Module:
    return nn.MaxPool2d(2, stride)


def conv_1x1(c: int, stride: int) -> nn.Module:
    return relu_conv_bn(c, c, 1, stride)


def conv_3x3(c: int, stride: int) -> nn.Module:
    return nn.Sequential(relu_conv_bn(c, c // 4), relu_conv_bn(c // 4, c // 4, 3, stride, 1),
                         relu_conv_bn(c // 4, c))


def conv_1x7_7x1(c: int, stride: int) -> nn.Module:
    return nn.Sequential(relu_conv_bn(c, c // 4),
                         relu_conv_bn(c // 4, c // 4, (1, 7), (1, stride), (0, 3)),
                         relu_conv_bn(c // 4, c // 4, (7, 1), (stride, 1), (3, 0)),
                         relu_conv_bn(c // 4, c))


Op = Callable[[int, int], nn.Module]

# (input state, operation) pairs; consecutive pairs are added into a new state.
NORMAL_OPS: tuple[tuple[int, Op], ...] = (
    (1, conv_1x1), (1, max_pool_3x3), (1, identity), (0, conv_1x7_7x1), (0, conv_1x1),
    (0, conv_1x7_7x1), (2, max_pool_3x3), (2, identity), (1, avg_pool_3x3), (5, conv_1x1),
)
NORMAL_CONCAT = (0, 3, 4, 6)
REDUCTION_OPS: tuple[tuple[int, Op], ...] = (
    (0, max_pool_2x2), (0, max_pool_3x3), (2, identity), (1, conv_3x3), (2, conv_1x7_7x1),
    (2, max_pool_3x3), (3, identity), (1, max_pool_2x2), (2, avg_pool_3x3), (3, conv_1x1),
)
REDUCTION_CONCAT = (4, 5, 6)


class Cell(nn.Module):
    """Maps (previous, previous-previous) states to a new state; reduction cells halve H, W."""

    def __init__(self, c_prev_prev: int, c_prev: int, c: int, reduction: bool,
                 reduction_prev: bool):
        super().__init__()
        self.reduce1 = relu_conv_bn(c_prev, c)
        if reduction_prev:
            self.reduce2: nn.Module = FactorizedReduce(c_prev_prev, c)
        elif c_prev_prev != c:
            self.reduce2 = relu_conv_bn(c_prev_prev, c)
        else:
            self.reduce2 = nn.Identity()
        ops = REDUCTION_OPS if reduction else NORMAL_OPS
        self.concat = REDUCTION_CONCAT if reduction else NORMAL_CONCAT
        self.indices = tuple(i for i, _ in ops)
        self.ops = nn.ModuleList(make(c, 2 if reduction and i < 2 else 1) for i, make in ops)
        self.out_channels = c * len(self.concat)

    def forward(self, prev, prev_prev):
        states = [self.reduce1(prev), self.reduce2(prev_prev)]
        for k in range(0, len(self.ops), 2):
            states.append(self.ops[k](states[self.indices[k]])
                          + self.ops[k + 1](states[self.indices[k + 1]]))
        return torch.cat([states[i] for i in self.concat], dim=1)


class AmoebaNetD(nn.Module):
    def __init__(self, num_classes: int, num_layers: int, num_filters: int):
        super().__init__()
        c = num_filters // 4
        self.stem = nn.Sequential(nn.ReLU(), nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(c))
        plan = [True, True]                      # two reduction cells finish the stem
        for group in range(3):
            plan += [False] * (num_layers // 3)
            if group < 2:
                plan.append(True)
        cells = []
        c_prev_prev = c_prev = c
        reduction_prev = False
        for reduction in plan:
            if reduction:
                c *= 2
            cell = Cell(c_prev_prev, c_prev, c, reduction, reduction_prev)
            cells.append(cell)
            c_prev_prev, c_prev, reduction_prev = c_prev, cell.out_channels, reduction
        self.cells = nn.ModuleList(cells)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_prev, num_classes)

    def forward(self, x):
        prev = prev_prev = self.stem(x)
        for cell in self.cells:
            prev, prev_prev = cell(prev, prev_prev), prev
        return self.fc(self.pool(prev).flatten(1))


def build_amoebanet_d(*, batch: int = 64, image_size: int = 224, num_classes: int = 1000,
                      num_layers: int = 18, num_filters: int = 256):
    """AmoebaNet-D (``num_layers``, ``num_filters``) in GPipe's notation."""
    check(num_layers % 3 == 0, f"num_layers must be a multiple of 3, got {num_layers}")
    check(num_filters % 8 == 0, f"num_filters must be a multiple of 8, got {num_filters}")
    check(image_size % 32 == 0, f"image_size must be a multiple of 32 (five reductions), "
                                f"got {image_size}")
    return AmoebaNetD(num_classes, num_layers, num_filters), images(batch, image_size)


ENTRIES = (
    ZooModel(
        name="amoebanet_d",
        description="AmoebaNet-D (18, 256) NAS-cell classifier (122M params), 224x224 ImageNet",
        build=build_amoebanet_d,
        tiny={"batch": 2, "image_size": 32, "num_classes": 10, "num_layers": 3,
              "num_filters": 16},
        source="NetSplit thesis §6.2.1: AmoebaNet-D with 18 layers, ImageNet 224x224, batch 64; "
               "Real et al. 2019 / GPipe / torchgpipe",
    ),
)
