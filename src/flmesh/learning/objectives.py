"""Loss building blocks for local training (torch, no grpc).

An :data:`Objective` maps ``(logits, labels)`` to a scalar loss; the trainer
calls ``objective(model(x), y)``. Plain cross-entropy is the default; an
algorithm plug-in may replace it (WSM, :mod:`flmesh.algorithms.wsm`).
A :data:`Regularizer` is an extra term added to the objective that needs more
than the logits: a teacher's logits on the same batch (Flashback's
distillation) or the model's parameters (FedCurv's penalty).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: An extra loss term: (model, inputs, logits) -> scalar tensor.
Regularizer = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean softmax cross-entropy over the batch."""
    return F.cross_entropy(logits, labels)
