"""Local training objectives (learning wing). An objective maps (logits, labels) to a loss."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

OBJECTIVES = ("ce",)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean softmax cross-entropy over the batch."""
    return F.cross_entropy(logits, labels)


def make_objective(name: str) -> Objective:
    if name == "ce":
        return cross_entropy
    raise ValueError(f"unknown objective {name!r} (expected one of {', '.join(OBJECTIVES)})")
