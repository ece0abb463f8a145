"""Flashback: label-count dynamic distillation on both sides of a round.

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
from typing import Any

import torch
from torch import nn

from flmesh.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientHalf,
    ServerContext,
    ServerHalf,
    Tensors,
    Update,
)
from flmesh.algorithms.fedavg import fedavg
from flmesh.config import Federation, TrainingConfig
from flmesh.config.params import Param
from flmesh.format.specs import ModelSpec
from flmesh.learning.data import derive_seed
from flmesh.learning.distillation import distill, dkd_loss
from flmesh.learning.objectives import Regularizer

FLASHBACK_PI = "flashback/pi"  # the global label count pi, float64 (C,), published with the model
SEED_DISTILL = 7  # stream id for the server's distillation order (see flmesh.learning.data)


def _counts(x: torch.Tensor | Sequence, name: str, ndim: int) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.float64).detach().cpu()
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all() or (t < 0).any():
        raise ValueError(f"{name} must hold finite, non-negative label counts")
    return t


def alpha_matrix(counts: torch.Tensor, nu: torch.Tensor | float) -> torch.Tensor:
    """The dynamic alpha of Sec. 4.1: ``alpha_i = mu_i / (nu + sum_k mu_k)``, per class.

    ``counts`` is (K, C), row i the label count mu_i of teacher i; ``nu`` is the
    *student's* label count vector (C,) (the paper's nu in R^C; a scalar is
    broadcast to every class). The sum runs over all K teachers given. A class
    with zero denominator (nobody, student included, holds it: 0/0) gets
    alpha = 0. Returns float32 (K, C).
    """
    mu = _counts(counts, "counts", 2)
    nu_t = torch.as_tensor(nu, dtype=torch.float64).detach().cpu()
    if nu_t.ndim == 0:
        nu_t = nu_t.expand(mu.shape[1])
    nu_t = _counts(nu_t, "nu", 1)
    if nu_t.shape[0] != mu.shape[1]:
        raise ValueError(f"nu has {nu_t.shape[0]} classes, counts have {mu.shape[1]}")
    denom = nu_t + mu.sum(dim=0)
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    alpha = torch.where(denom > 0, mu / safe, torch.zeros_like(mu))
    return alpha.to(torch.float32)


def client_alpha(own_counts: torch.Tensor, global_counts: torch.Tensor) -> torch.Tensor:
    """Algorithm 1 line 7: alpha (C,) for the local step's single teacher w_{t-1}.

    nu = the client's own label count, the teacher's mu = pi (the global label
    count), so ``alpha = pi / (own + pi)``, 0 where both are 0. Pass it to
    :func:`flmesh.learning.distillation.dkd_loss` (added to CE, Eq. 3). In round 1 pi = 0 and
    alpha = 0 (the paper uses plain CE then).
    """
    own = _counts(own_counts, "own_counts", 1)
    return alpha_matrix(_counts(global_counts, "global_counts", 1).unsqueeze(0), own)[0]


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


class FlashbackClient(ClientHalf):
    """Algorithm 1 line 10: CE plus dKD against the global model the round started from,
    alpha = pi / (own counts + pi); plain CE while pi is 0 (round 1)."""

    def __init__(self, ctx: ClientContext):
        super().__init__()
        self.ctx = ctx

    def regularizers(self, start: Tensors, published: Tensors) -> list[Regularizer]:
        pi = published[FLASHBACK_PI]
        if float(pi.sum()) <= 0:
            return []
        device = self.ctx.device
        teacher = self.ctx.model_factory()
        teacher.load_state_dict(start)
        teacher.to(device).eval()
        alpha = client_alpha(torch.tensor(self.ctx.label_counts), pi).to(device)

        def dkd(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                teacher_logits = teacher(x)
            return dkd_loss(logits, teacher_logits, alpha)

        return [dkd]


class FlashbackServer(ServerHalf):
    """Algorithm 1 lines 14-29: FedAvg, then distillation on the public split with teachers =
    this round's client models (+ the previous global model from round 2), per-class alphas
    from label counts; then the global label count pi grows."""

    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.server_epochs = ctx.settings.server_epochs
        self.state = FlashbackState.start(ctx.num_classes, ctx.settings.gamma)

    def published_extras(self, round: int) -> Tensors:
        return {FLASHBACK_PI: self.state.pi.clone()}

    def _model(self, state: Tensors) -> nn.Module:
        model = self.ctx.model_factory()
        model.load_state_dict(state)
        return model

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        averaged = fedavg([u.state for u in updates], [u.num_samples for u in updates])
        counts = torch.tensor([list(u.label_counts) for u in updates], dtype=torch.float64)
        alphas = self.state.server_alphas(counts)
        teachers = [self._model(u.state) for u in updates]
        if self.state.teacher_counts() is not None:
            teachers.append(self._model(global_state))
        public = self.ctx.public
        if public is not None and len(public) and self.server_epochs > 0:
            fed = self.ctx.federation
            student = self._model(averaged)
            distill(student, teachers, alphas, public, self.server_epochs, fed.training,
                    derive_seed(fed.seed, SEED_DISTILL, round), self.ctx.device, self.ctx.compute)
            averaged = {k: v.detach().to("cpu") for k, v in student.state_dict().items()}
        self.state = advance(self.state, [u.node for u in updates], counts)
        return averaged

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        return ({"pi": self.state.pi.clone()},
                {"participations": dict(self.state.participations), "rounds": self.state.rounds})

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        self.state = FlashbackState(self.state.gamma, tensors["pi"].to(torch.float64).clone(),
                                    {str(k): int(v) for k, v in values["participations"].items()},
                                    int(values["rounds"]))


class Flashback(Algorithm):
    name = "flashback"
    kind = "strategy"
    params = (Param("server_epochs", float, 1.0, "E_s: distillation epochs on the public split (0: none)",
                    lo=0, hi=1000, old="server_epochs"),
              Param("gamma", float, 0.1, "rate at which the global label count pi grows (Alg. 1)",
                    lo=0, hi=1, lo_open=True, old="gamma"))

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.aggregator is not None and federation.aggregator.strategy == self.name

    def published_spec(self, params: ModelSpec, num_classes: int, num_nodes: int) -> ModelSpec:
        return {FLASHBACK_PI: (torch.float64, (num_classes,))}

    def client(self, ctx: ClientContext) -> ClientHalf:
        return FlashbackClient(ctx)

    def server(self, ctx: ServerContext) -> ServerHalf:
        return FlashbackServer(ctx)
