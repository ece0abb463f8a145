"""FedProx: local training with a proximal term that keeps each node near its starting model.

Li et al., *Federated Optimization in Heterogeneous Networks* (MLSys 2020), Eq. (2): client k
minimises ``h_k(w; w_t) = F_k(w) + mu/2 ||w - w_t||^2``, where ``w_t`` is the global model it
started the round from; the server averages as FedAvg (Algorithm 2). Here the term is a
regularizer on every trainable parameter (``mu`` from ``[aggregator.params]``). Between peers
(no aggregator; ``[algorithm.fedprox] mu > 0``) the anchor ``w_t`` is the model the node
received this round (its own when none came), and the schedule moves models as it does
without FedProx. ``mu = 0`` is FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from flmesh.learning.objectives import Regularizer


def proximal_term(model: nn.Module, anchor: Tensors, mu: float) -> torch.Tensor:
    """``mu/2 * sum_p ||p - anchor[p]||^2`` over ``model``'s trainable parameters (Eq. 2), as a
    differentiable scalar in the parameters' dtype. ``anchor`` holds tensors on the model's
    device, by parameter name."""
    terms = [((p - anchor[name]) ** 2).sum() for name, p in model.named_parameters()
             if p.requires_grad and name in anchor]
    if not terms:
        return torch.zeros(())
    return 0.5 * mu * torch.stack(terms).sum()


class FedProxClient(ClientHalf):
    def __init__(self, ctx: ClientContext, mu: float):
        super().__init__()
        self.ctx, self.mu = ctx, mu

    def regularizers(self, start: Tensors, published: Tensors) -> list[Regularizer]:
        if self.mu <= 0:
            return []
        anchor = {k: v.detach().to(self.ctx.device) for k, v in start.items() if v.is_floating_point()}
        mu = self.mu

        def proximal(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
            return proximal_term(model, anchor, mu)

        return [proximal]


class FedProxServer(ServerHalf):
    """FedAvg's weighted mean (Algorithm 2's server step)."""

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        return fedavg([u.state for u in updates], [u.num_samples for u in updates])


class FedProx(Algorithm):
    name = "fedprox"
    kind = "strategy"
    stale_updates = True
    params = (Param("mu", float, 0.01, "mu of the proximal term mu/2 ||w - w_t||^2 (Eq. 2)", lo=0, hi=1e6),)

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        if federation.aggregator is not None:
            return self.is_strategy(federation)
        return self.name in federation.algorithms and self.settings(federation).mu > 0

    def client(self, ctx: ClientContext) -> ClientHalf:
        return FedProxClient(ctx, ctx.settings.mu)

    def server(self, ctx: ServerContext) -> ServerHalf:
        return FedProxServer()
