"""The learner: label-smoothed cross-entropy with gradient-norm clipping, and macro-F1.

Named in a federation file as ``[training] learner = "flmesh_custom_example.learner:ClippedLearner"``
(called with no arguments). flmesh still decides how many batches a round trains on; this
class decides how one step is taken and what is measured besides accuracy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

import flmesh

Batch = tuple[torch.Tensor, torch.Tensor]


class ClippedLearner(flmesh.Learner):
    """One optimizer step per batch on ``CE(label_smoothing) + the algorithm's extra terms``,
    the gradient clipped to an L2 norm of ``max_norm``. Stateless: one object serves every
    model of a process."""

    def __init__(self, max_norm: float = 1.0, smoothing: float = 0.05):
        self.max_norm, self.smoothing = max_norm, smoothing

    def train(self, model: nn.Module, batches: Iterable[Batch],
              context: flmesh.TrainContext) -> Mapping[str, float]:
        total, norms, seen, steps = 0.0, 0.0, 0, 0
        for x, y in batches:
            context.optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y, label_smoothing=self.smoothing)
            loss = loss + context.extra_loss(model, x, logits)  # FedProx, FedCurv, ... keep working
            loss.backward()
            norms += float(nn.utils.clip_grad_norm_(model.parameters(), self.max_norm))
            context.optimizer.step()
            total += float(loss.detach()) * len(y)
            seen, steps = seen + len(y), steps + 1
        # "loss" is the round's train loss; grad_norm (before clipping) is reported beside it
        return {"loss": total / max(seen, 1), "grad_norm": norms / max(steps, 1)}

    def evaluate(self, model: nn.Module, batches: Iterable[Batch],
                 context: flmesh.EvalContext) -> Mapping[str, float]:
        classes = context.num_classes
        confusion = torch.zeros(classes * classes, dtype=torch.long)
        for x, y in batches:
            predicted = model(x).argmax(1)
            confusion += torch.bincount((y * classes + predicted).cpu(), minlength=classes * classes)
        matrix = confusion.view(classes, classes)  # rows: true class, columns: predicted
        hits = matrix.diag().double()
        support, predicted_count = matrix.sum(1).double(), matrix.sum(0).double()
        present = (support + predicted_count) > 0  # a class neither present nor predicted: skipped
        f1 = 2 * hits[present] / (support[present] + predicted_count[present])
        return {"macro_f1": float(f1.mean()) if len(f1) else 0.0}
