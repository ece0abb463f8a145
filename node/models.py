"""Models for the federation file's ``[model]`` section (learning wing)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from flmesh.topology import ModelConfig


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


MODELS = ("mlp", "cnn")


class ModelError(ValueError):
    """The model cannot be built for this data; the message says why."""


def build_model(cfg: ModelConfig, input_shape: Sequence[int], num_classes: int,
                seed: int | None = None) -> nn.Module:
    """A fresh model. With ``seed``, its initial weights depend only on the seed
    (the global RNG is left as it was), so every node can start from the same M_0."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        if cfg.name == "mlp":
            return MLP(input_shape, num_classes, cfg.hidden)
        if cfg.name == "cnn":
            if len(input_shape) != 3:
                raise ModelError(f"model 'cnn' needs (C, H, W) images, the data has shape {input_shape}")
            return SmallCNN(input_shape, num_classes, cfg.channels)
    raise ModelError(f"unknown model {cfg.name!r} (expected one of {', '.join(MODELS)})")
