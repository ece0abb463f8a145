"""WSM: the re-weighted softmax cross-entropy (``[training] objective = "wsm"``).

Legate, *Re-Weighted Softmax Cross-Entropy to Control Forgetting in Federated
Learning* (thesis), Sec. 2.2, Eq. 15: each node reweights its softmax by its
own class proportions alpha_k, so classes it does not hold get no push
downwards and the global model forgets less of them. A client-only plug-in:
it composes with every strategy (and with peer schedules); evaluation uses
the raw logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import functional as F

from flmesh.algorithms.base import Algorithm, ClientContext, ClientHalf
from flmesh.config import Federation, TrainingConfig
from flmesh.learning.objectives import Objective

#: What log(0) becomes in WSM. exp(-1e4) is exactly 0 in float32 and float64, so
#: an absent class drops out of the softmax (zero probability, zero gradient),
#: while every value and gradient stays finite -- also for a sample whose label
#: the proportions say is absent (its loss is then about 1e4, not inf).
WSM_LOG_ZERO = -1.0e4


def wsm_log_weights(class_proportions: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """log(alpha) for WSM, float32, with log 0 clamped to :data:`WSM_LOG_ZERO`.

    ``class_proportions`` is the node's class distribution alpha_k (fractions, or
    raw label counts: scaling alpha by a constant does not change the loss).
    Raises ValueError unless it is a 1-D vector of finite, non-negative numbers
    with at least one positive entry.
    """
    alpha = torch.as_tensor(class_proportions, dtype=torch.float64).detach().cpu()
    if alpha.ndim != 1 or alpha.numel() == 0:
        raise ValueError(f"wsm class_proportions must be a non-empty 1-D vector, got shape "
                         f"{tuple(alpha.shape)}")
    if not torch.isfinite(alpha).all() or (alpha < 0).any():
        raise ValueError("wsm class_proportions must be finite and non-negative")
    if not (alpha > 0).any():
        raise ValueError("wsm class_proportions are all zero: the node holds no labelled samples")
    return torch.log(alpha).clamp_min(WSM_LOG_ZERO).to(torch.float32)


def wsm_loss(logits: torch.Tensor, labels: torch.Tensor, class_proportions: torch.Tensor) -> torch.Tensor:
    """Re-weighted softmax cross-entropy (WSM), Legate thesis Sec. 2.2, Eq. 15.

    Eq. 15 per sample is ``-[f(x)_y - log sum_c alpha_c exp(f(x)_c)]`` with alpha
    the node's class proportions. As the reading notes ask, this is computed as
    ordinary cross-entropy on ``logits + log(alpha)``: the two differ only by the
    constant ``-log(alpha_y)`` per sample, so the gradients are identical, and
    the value stays bounded below by 0. ``log 0`` is clamped to
    :data:`WSM_LOG_ZERO`, so a class the node does not hold has no effect on the
    loss or its gradient (a node holding a single class gets zero gradient:
    expected). Mean over the batch (Eq. 15 sums; the mean matches
    :func:`cross_entropy`). Evaluation uses the raw logits, not this loss.

    ``class_proportions`` may be fractions or raw counts (any positive scale
    gives the same loss); it must have one entry per logit column.
    """
    return _wsm_cross_entropy(logits, labels, wsm_log_weights(class_proportions))


def _wsm_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, log_alpha: torch.Tensor) -> torch.Tensor:
    if log_alpha.shape[0] != logits.shape[-1]:
        raise ValueError(f"wsm class_proportions has {log_alpha.shape[0]} classes, "
                         f"the logits have {logits.shape[-1]}")
    return F.cross_entropy(logits + log_alpha.to(device=logits.device, dtype=logits.dtype), labels)


class WsmClient(ClientHalf):
    """alpha_k is the node's class distribution; in a continual federation it follows the
    node's data from task to task (plain CE while the node holds no data)."""

    def __init__(self, label_counts: Sequence[int], ctx: ClientContext | None = None):
        super().__init__()
        self.ctx = ctx
        self.log_alpha: torch.Tensor | None = None
        self._set(label_counts)

    def _set(self, label_counts: Sequence[int]) -> None:
        # validated once here, not per batch; a node without data (yet) has no alpha
        self.log_alpha = wsm_log_weights(label_counts) if sum(label_counts) > 0 or self.ctx is None else None

    def objective(self, base: Objective) -> Objective:
        def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            if self.log_alpha is None:
                return base(logits, labels)
            return _wsm_cross_entropy(logits, labels, self.log_alpha)

        return loss

    def after_task_change(self, new_task: int) -> None:
        if self.ctx is not None:
            self._set(self.ctx.label_counts)


class Wsm(Algorithm):
    name = "wsm"
    kind = "objective"

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return training.objective == self.name

    def client(self, ctx: ClientContext) -> ClientHalf:
        return WsmClient(ctx.label_counts, ctx)
