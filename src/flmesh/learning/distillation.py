"""Label-count weighted distillation losses and the multi-teacher distillation loop.

Flashback (*Flashback: Understanding and Mitigating Forgetting in Federated
Learning*, Sec. 4.1, Eq. 3): a student learns from teachers through a KL
divergence weighted per class by alpha, so a teacher counts for the classes
it has seen. :mod:`flmesh.algorithms.flashback` computes the alphas from
label counts and uses these losses on both sides of a round.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from flmesh.config import TrainingConfig
from flmesh.learning.arrays import ArrayData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.objectives import cross_entropy
from flmesh.learning.trainer import TrainStats, train


def dkd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Flashback's label-count weighted KL, L_dKL (Sec. 4.1, the term inside Eq. 3).

    ``sum_c alpha^c * p^c * log(p^c / q^c)`` with p the teacher's and q the
    student's softmax, averaged over the batch. ``alpha`` is one teacher's
    per-class weight vector, shape (C,) (or (N, C) per sample), as computed by
    :func:`flmesh.algorithms.flashback.client_alpha`. No temperature (the paper gives none).
    Not clamped: with per-class weights the sum can be negative, and the reading
    notes say to keep it so. The teacher's logits are detached (no gradient
    flows into a teacher). With ``alpha`` all ones this is plain KL(teacher || student).
    """
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"teacher logits have shape {tuple(teacher_logits.shape)}, the student's "
                         f"{tuple(student_logits.shape)}")
    alpha = alpha.to(device=student_logits.device, dtype=student_logits.dtype)
    if alpha.shape[-1] != student_logits.shape[-1]:
        raise ValueError(f"alpha has {alpha.shape[-1]} classes, the logits have {student_logits.shape[-1]}")
    log_q = F.log_softmax(student_logits, dim=-1)
    log_p = F.log_softmax(teacher_logits.detach(), dim=-1)
    # p * (log p - log q): p underflowing to 0 multiplies a finite log p, so no 0 * -inf.
    per_class = log_p.exp() * (log_p - log_q)
    return (alpha * per_class).sum(dim=-1).mean()


def multi_teacher_dkd_loss(student_logits: torch.Tensor, teacher_logits: Sequence[torch.Tensor],
                           alphas: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Flashback's server-side distillation loss, Eq. 3 as used in Algorithm 1 line 21.

    ``L_CE(student, y) + sum_i L_dKL(teacher_i, student; alpha_i)``: the teachers
    (this round's client models, plus the previous global model from round 2 on)
    are not averaged; each contributes its own alpha-weighted KL and the terms
    are summed, as Eq. 3 writes it. ``alphas`` is (T, C), row i for teacher i
    (:func:`flmesh.algorithms.flashback.server_alphas`); the CE term needs the
    labelled public split. No teachers gives plain CE.
    """
    if alphas.ndim != 2 or alphas.shape[0] != len(teacher_logits):
        raise ValueError(f"alphas has shape {tuple(alphas.shape)}, expected ({len(teacher_logits)}, C): "
                         f"one row per teacher")
    loss = F.cross_entropy(student_logits, labels)
    for i, t_logits in enumerate(teacher_logits):
        loss = loss + dkd_loss(student_logits, t_logits, alphas[i])
    return loss


def distill(student: nn.Module, teachers: Sequence[nn.Module], alphas: torch.Tensor, public: ArrayData,
            epochs: float, cfg: TrainingConfig, seed: int,
            device: torch.device | None = None, compute: Compute = UNGATED) -> TrainStats:
    """Server-side distillation, Algorithm 1 lines 16-23: train ``student`` in place on ``public``.

    Ordinary training (:func:`flmesh.learning.trainer.train`: fresh optimizer from
    ``cfg``, seeded batch order, fractional ``epochs``) with the loss of
    :func:`multi_teacher_dkd_loss`: CE on the labelled
    public split plus each teacher's alpha-weighted KL, added as a regularizer.
    Teachers run in eval mode without gradients (moved to ``device``); ``alphas``
    is (len(teachers), C), e.g. :func:`server_alphas`.
    """
    if alphas.ndim != 2 or alphas.shape[0] != len(teachers):
        raise ValueError(f"alphas has shape {tuple(alphas.shape)}, expected ({len(teachers)}, C)")
    if alphas.shape[0] and alphas.shape[1] != public.num_classes:
        raise ValueError(f"alphas has {alphas.shape[1]} classes, the public split {public.num_classes}")
    device = device or torch.device("cpu")
    for t in teachers:
        t.to(device).eval()
    alphas = alphas.to(device)

    def teachers_kl(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = [t(x) for t in teachers]
        # multi_teacher_dkd_loss minus its CE term, which train() already adds
        return sum((dkd_loss(logits, tl, alphas[i]) for i, tl in enumerate(teacher_logits)),
                   torch.zeros((), device=logits.device))

    return train(student, public, cfg, epochs=epochs, seed=seed, device=device,
                 objective=cross_entropy, regularizers=[teachers_kl], compute=compute)
