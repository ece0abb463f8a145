"""Flashback: label-count dynamic distillation (pure, transport-free).

*Flashback: Understanding and Mitigating Forgetting in Federated Learning*,
Sec. 4.1 (Eq. 3, the dynamic alpha) and Sec. 4.2 / Algorithm 1. One round t:

1. every participating client k starts from w_{t-1} and trains on
   ``CE + dKL(w_{t-1} -> w_k; alpha)`` (line 10, plain CE in round 1) with
   ``alpha = client_alpha(mu_k, pi)`` (line 7: nu is the client's own label
   count, the single teacher w_{t-1} has label count pi);
2. the server averages the client models with FedAvg (lines 14-15);
3. the server distils into that average on a labelled public split (lines
   16-23) with :func:`distill`: teachers are the client models, plus w_{t-1}
   from round 2 on, and ``alphas = server_alphas(mu, pi or None)`` (line 18:
   nu is pi, the client teachers have their mu_k and w_{t-1} has pi);
4. the bookkeeping :func:`advance` increments r_k for the participants and adds
   gamma * mu_k to pi while gamma * r_k <= 1 (lines 24-29).

So every alpha of round t uses the pi of the end of round t-1. Label counts are
raw counts (reading notes); gamma's value is not given by the paper.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from flmesh.node.client_terms import _counts, alpha_matrix, client_alpha
from flmesh.node.data import ArrayData
from flmesh.node.objectives import cross_entropy, dkd_loss
from flmesh.node.trainer import TrainStats, train
from flmesh.topology import TrainingConfig

#: Slack on ``gamma * r_k <= 1`` so that e.g. gamma = 0.1 admits r_k = 10 whatever the rounding.
GAMMA_EPS = 1e-9


def server_alphas(client_counts: torch.Tensor, global_counts: torch.Tensor | None) -> torch.Tensor:
    """Algorithm 1 lines 17-18: alphas (T, C) for the server-side distillation.

    Teachers, in this row order: the K participating clients (row k uses mu_k),
    then, when ``global_counts`` is given (round t > 1), the previous global
    model w_{t-1} with mu = pi. The student's nu is pi (the new global model's
    label count before this round's update); ``global_counts=None`` (round 1)
    means no w_{t-1} teacher and nu = 0. So for t > 1 the denominator is
    ``pi + sum_k mu_k + pi``.
    """
    mu = _counts(client_counts, "client_counts", 2)
    if global_counts is None:
        return alpha_matrix(mu, 0.0)
    pi = _counts(global_counts, "global_counts", 1)
    return alpha_matrix(torch.cat([mu, pi.unsqueeze(0)]), pi)


def update_global_counts(pi: torch.Tensor, client_counts: torch.Tensor, gamma: float,
                         participations: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Algorithm 1 lines 25-29: ``pi + sum_k [gamma * r_k <= 1] * gamma * mu_k``.

    ``client_counts`` (K, C) are this round's participants' label counts and
    ``participations`` their r_k *after* this round's increment (line 24), so a
    client's first participation has r_k = 1. A client therefore feeds pi in
    its first floor(1/gamma) participations, and pi tends to the sum of the
    label counts of the clients seen often enough. Returns float64 (C,).
    """
    if not 0 < gamma <= 1:
        raise ValueError(f"flashback gamma must be in (0, 1], got {gamma}")
    pi_t = _counts(pi, "pi", 1)
    mu = _counts(client_counts, "client_counts", 2)
    r = torch.as_tensor(participations, dtype=torch.float64).reshape(-1)
    if r.shape[0] != mu.shape[0]:
        raise ValueError(f"got {mu.shape[0]} client label counts but {r.shape[0]} participation counts")
    if mu.shape[1] != pi_t.shape[0]:
        raise ValueError(f"client label counts have {mu.shape[1]} classes, pi has {pi_t.shape[0]}")
    if (r < 1).any():
        raise ValueError("participation counts r_k must be >= 1 (they include this round)")
    take = (gamma * r <= 1 + GAMMA_EPS).to(torch.float64)
    return pi_t + gamma * (take.unsqueeze(1) * mu).sum(dim=0)


@dataclass(frozen=True)
class FlashbackState:
    """What the Flashback aggregator carries between rounds (Algorithm 1).

    ``pi``: the global model's label count (float64, (C,)); ``participations``:
    r_k per client id; ``rounds``: completed rounds (t - 1 during round t).
    Immutable: :func:`advance` returns the next state.
    """

    gamma: float
    pi: torch.Tensor
    participations: Mapping[str, int] = field(default_factory=dict)
    rounds: int = 0

    @classmethod
    def start(cls, num_classes: int, gamma: float) -> FlashbackState:
        """Line 1: pi = 0, nobody has participated."""
        if not 0 < gamma <= 1:
            raise ValueError(f"flashback gamma must be in (0, 1], got {gamma}")
        return cls(gamma, torch.zeros(num_classes, dtype=torch.float64), {}, 0)

    def teacher_counts(self) -> torch.Tensor | None:
        """pi when the previous global model is a teacher (round t > 1), else None."""
        return None if self.rounds == 0 else self.pi.clone()

    def client_alpha(self, own_counts: torch.Tensor) -> torch.Tensor:
        return client_alpha(own_counts, self.pi)

    def server_alphas(self, client_counts: torch.Tensor) -> torch.Tensor:
        return server_alphas(client_counts, self.teacher_counts())


def advance(state: FlashbackState, clients: Sequence[str], client_counts: torch.Tensor) -> FlashbackState:
    """End of round (Algorithm 1 lines 24-29): increment r_k, then update pi.

    ``clients`` are this round's participant ids (distinct), row k of
    ``client_counts`` (K, C) their label counts mu_k.
    """
    if len(set(clients)) != len(clients):
        raise ValueError("flashback participants must be distinct")
    participations = dict(state.participations)
    for k in clients:
        participations[k] = participations.get(k, 0) + 1
    r = [participations[k] for k in clients]
    pi = update_global_counts(state.pi, client_counts, state.gamma, r)
    return FlashbackState(state.gamma, pi, participations, state.rounds + 1)


def distill(student: nn.Module, teachers: Sequence[nn.Module], alphas: torch.Tensor, public: ArrayData,
            epochs: float, cfg: TrainingConfig, seed: int,
            device: torch.device | None = None) -> TrainStats:
    """Server-side distillation, Algorithm 1 lines 16-23: train ``student`` in place on ``public``.

    Ordinary training (:func:`flmesh.node.trainer.train`: fresh optimizer from
    ``cfg``, seeded batch order, fractional ``epochs``) with the loss of
    :func:`flmesh.node.objectives.multi_teacher_dkd_loss`: CE on the labelled
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
                 objective=cross_entropy, regularizers=[teachers_kl])
