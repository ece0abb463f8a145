"""The built-in architectures: ``mlp`` and ``cnn`` are small models sized for the digits,
``cnn2`` is the CNN of McMahan et al. 2017 and ``resnet18`` torchvision's ResNet-18 with batch
or group normalisation. Every model returns logits (the softmax is in the loss).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import nn

from flmesh.learning.extras import require
from flmesh.learning.weights import ModelError


class MLP(nn.Module):
    """Flatten, then ``hidden`` fully connected ReLU layers, then a linear classifier."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (64,)):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """3x3 conv + ReLU blocks (``channels``), one 2x2 max-pool, then a linear classifier.

    Sized for small images such as the 8x8 digits; the pool halves the spatial size once.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int,
                 channels: Sequence[int] = (16, 32)):
        super().__init__()
        c, h, w = input_shape
        layers: list[nn.Module] = []
        for out in channels:
            layers += [nn.Conv2d(c, out, 3, padding=1), nn.ReLU()]
            c = out
        layers += [nn.MaxPool2d(2), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c * (h // 2) * (w // 2), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class FedAvgCNN(nn.Module):
    """The CNN of McMahan et al. 2017 (FedAvg): two 5x5 conv layers with 32 and 64
    channels, each followed by ReLU and 2x2 max-pooling, a 512-unit fully connected
    ReLU layer and a linear output layer (the softmax is in the loss).

    The convolutions use 'same' padding, which gives the paper's 1,663,370
    parameters on 28x28 grey images; the flattened size follows the input shape
    (64 * 8 * 8 on 32x32 RGB images).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int):
        super().__init__()
        c, h, w = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(nn.Linear(64 * (h // 2 // 2) * (w // 2 // 2), 512), nn.ReLU())
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.fc(self.features(x)))


RESNET_WIDTHS = (64, 128, 256, 512)
NORMS = ("batch", "group")


def resnet18(input_shape: Sequence[int], num_classes: int, norm: str = "batch", groups: int = 2,
             small_input: bool | None = None) -> nn.Module:
    """torchvision's ResNet-18 (random initialisation) for (C, H, W) images.

    ``norm = "group"`` puts GroupNorm(``groups``, width) wherever ResNet has
    BatchNorm2d (the WSM thesis compares the two under non-IID data).
    ``small_input`` (default: H and W <= 64) swaps the ImageNet stem (7x7 stride-2
    conv, then 3x3 max-pool) for the usual CIFAR stem (3x3 stride-1 conv, no
    max-pool); the input conv is also rebuilt when C != 3.
    """
    tv_resnet18 = require("torchvision.models", "vision", "model 'resnet18'").resnet18

    c, h, w = input_shape
    norm_layer: Callable[..., nn.Module]
    if norm == "batch":
        norm_layer = nn.BatchNorm2d
    elif norm == "group":
        if any(width % groups for width in RESNET_WIDTHS):
            divisors = [g for g in range(1, 65) if 64 % g == 0]
            raise ModelError(f"model 'resnet18' with norm = 'group' needs groups dividing 64 "
                             f"(one of {', '.join(map(str, divisors))}), got {groups}")
        norm_layer = partial(nn.GroupNorm, groups)
    else:
        raise ModelError(f"unknown norm {norm!r} (expected one of {', '.join(NORMS)})")
    model = tv_resnet18(weights=None, num_classes=num_classes, norm_layer=norm_layer)
    if small_input is None:
        small_input = h <= 64 and w <= 64
    if small_input:
        model.conv1 = nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif c != 3:
        model.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
    if small_input or c != 3:  # as torchvision initialises its own convolutions
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model
