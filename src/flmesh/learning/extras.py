"""Optional dependencies: the core (digits, MLP, CNN, every schedule and algorithm) needs none.

torchvision is the ``flmesh[vision]`` extra (MNIST/CIFAR/EMNIST and ResNet-18):
a CPU build of torch, as an edge device or a small image installs it, cannot
load PyPI's torchvision, and the core must not need it.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message (one line) names the extra."""


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module``, or raise MissingExtra naming ``pip install 'flmesh[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(f"{what} needs {module.split('.')[0]}, which is not installed or does not load "
                           f"({exc}); install the extra: pip install 'flmesh[{extra}]'") from None
