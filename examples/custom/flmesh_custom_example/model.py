"""The model factory: a small 1-D CNN over (channels, length) sequences.

Named in a federation file as ``[model] factory = "flmesh_custom_example.model:wave_cnn"``;
``[model.args]`` reach it as keyword arguments, beside flmesh's ``input_shape`` and
``num_classes``."""

from __future__ import annotations

from torch import nn


def wave_cnn(*, input_shape: tuple[int, ...], num_classes: int, channels: int = 16,
             kernel: int = 5) -> nn.Module:
    """Two convolutions, then global average pooling (so any sequence length works) and a
    linear classifier. ``input_shape`` is (channels, length) or (length,)."""
    if len(input_shape) not in (1, 2):
        raise ValueError(f"wave_cnn expects sequences of shape (channels, length), got {input_shape}")
    inputs = input_shape[0] if len(input_shape) == 2 else 1
    layers: list[nn.Module] = [] if len(input_shape) == 2 else [nn.Unflatten(1, (1, input_shape[0]))]
    layers += [
        nn.Conv1d(inputs, channels, kernel, padding=kernel // 2), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(channels, channels, kernel, padding=kernel // 2), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(channels, num_classes),
    ]
    return nn.Sequential(*layers)
