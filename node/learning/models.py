"""Models for the federation file's ``[model]`` section (learning wing).

``mlp`` and ``cnn`` are small models sized for the digits; ``cnn2`` is the CNN
of McMahan et al. 2017 and ``resnet18`` torchvision's ResNet-18 with batch or
group normalisation. Every model returns logits (the softmax is in the loss).
Any model can start from a local state-dict file (``[model] weights``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from torch import nn

from flmesh.node.learning.extras import require
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


class ModelError(ValueError):
    """The model cannot be built for this data; the message says why."""


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


MODELS = ("mlp", "cnn", "cnn2", "resnet18")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _final_linear(model: nn.Module) -> str | None:
    """The name of the model's last nn.Linear module (its classifier), if any."""
    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = name
    return last


def _hint(key: str) -> str:
    if key.rsplit(".", 1)[-1] in ("running_mean", "running_var", "num_batches_tracked"):
        return " (batch-norm statistics: was the file saved with the same [model] norm?)"
    if key == "conv1.weight":
        return " (check [model] small_input: 3x3 small-input stem vs 7x7 ImageNet stem)"
    return ""


def load_weights(model: nn.Module, path: str | Path) -> list[str]:
    """Copy the tensors of a state-dict file (``torch.save(model.state_dict(), path)``)
    into ``model``; returns the names it left as they were.

    The file is read with ``torch.load(weights_only=True)``, so it cannot run code.
    Every tensor must match by name and shape, except the final linear layer,
    which keeps its fresh initialisation when the file has another number of
    classes. Anything else raises ModelError naming the file and the first tensor
    that does not fit; the model is only changed when the whole file fits.
    """
    where = f"[model] weights {path}"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelError(f"{where}: file not found") from None
    except Exception as exc:  # unpickling, zip and torch errors alike: the file is not usable
        raise ModelError(f"{where}: not a state dict saved with torch.save ({_one_line(exc)})") from None
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]  # a checkpoint that wraps the state dict
    if not isinstance(state, Mapping) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ModelError(f"{where}: expected a state dict (tensor name -> tensor), "
                         f"got {type(state).__name__}")
    if state and all(k.startswith("module.") for k in state):  # saved from (Distributed)DataParallel
        state = {k.removeprefix("module."): v for k, v in state.items()}

    own = model.state_dict()
    head = _final_linear(model)
    head_keys = {f"{head}.weight", f"{head}.bias"} if head is not None else set()
    keep: list[str] = []
    for key, mine in own.items():
        theirs = state.get(key)
        if theirs is None:
            raise ModelError(f"{where} does not fit model: tensor {key!r} is missing from the file"
                             f"{_hint(key)}")
        if theirs.shape != mine.shape:
            if key in head_keys and theirs.shape[1:] == mine.shape[1:]:
                keep.append(key)  # another number of classes: this layer starts fresh
                continue
            raise ModelError(f"{where} does not fit model: tensor {key!r} has shape "
                             f"{list(theirs.shape)} in the file, the model needs {list(mine.shape)}"
                             f"{_hint(key)}")
    extra = next((k for k in state if k not in own), None)
    if extra is not None:
        raise ModelError(f"{where} does not fit model: the file has tensor {extra!r}, which the "
                         f"model lacks{_hint(extra)}")
    with torch.no_grad():
        for key, mine in own.items():
            if key not in keep:
                mine.copy_(state[key])
    return keep


def _architecture(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if cfg.name == "mlp":
        return MLP(input_shape, num_classes, cfg.hidden)
    if cfg.name not in MODELS:
        raise ModelError(f"unknown model {cfg.name!r} (expected one of {', '.join(MODELS)})")
    if len(input_shape) != 3:
        raise ModelError(f"model {cfg.name!r} needs (C, H, W) images, the data has shape {input_shape}")
    if cfg.name == "cnn":
        return SmallCNN(input_shape, num_classes, cfg.channels)
    if cfg.name == "cnn2":
        if min(input_shape[1:]) < 4:
            raise ModelError(f"model 'cnn2' needs images of at least 4x4, the data has shape {input_shape}")
        return FedAvgCNN(input_shape, num_classes)
    return resnet18(input_shape, num_classes, norm=cfg.norm, groups=cfg.groups,
                    small_input=cfg.small_input)


def build_model(cfg: ModelConfig, input_shape: Sequence[int], num_classes: int,
                seed: int | None = None) -> nn.Module:
    """A fresh model. With ``seed``, its initial weights depend only on the seed
    (the global RNG is left as it was), so every node can start from the same M_0.
    With ``cfg.weights``, the model then starts from that file (see :func:`load_weights`)."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = _architecture(cfg, tuple(input_shape), num_classes)
    if cfg.weights is not None:
        load_weights(model, cfg.weights)
    return model


class ModelPool:
    """Spare models of one architecture, loaded with a state on loan and kept for the next caller.

    RPC handlers evaluate and fine-tune other nodes' models; building a model
    (seeded initialisation) for every call costs more than the evaluation of a
    small one. Thread-safe; keeps at most ``keep`` idle models.
    """

    def __init__(self, factory: Callable[[], nn.Module], device: torch.device, keep: int = 4):
        self._factory, self._device, self._keep = factory, device, keep
        self._idle: list[nn.Module] = []
        self._lock = threading.Lock()

    @contextmanager
    def loaded(self, state: Mapping[str, torch.Tensor]) -> Iterator[nn.Module]:
        """A model holding ``state`` (parameters and buffers) for the ``with`` block."""
        with self._lock:
            model = self._idle.pop() if self._idle else None
        if model is None:
            model = self._factory().to(self._device)
        model.load_state_dict(state)
        try:
            yield model
        finally:
            with self._lock:
                if len(self._idle) < self._keep:
                    self._idle.append(model)
