"""FedAvgM: FedAvg with server momentum.

Hsu, Qi and Brown, *Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification* (2019), Sec. 3: ``v <- beta v + Delta w``, ``w <- w - v``, with
``Delta w`` the clients' weighted mean change. Written on the pseudo-gradient
``Delta_t = mean(x_i) - x_t`` (:mod:`~flmesh.algorithms.server_opt`) with a server
learning rate ``eta``: ``v_t = beta v_{t-1} + Delta_t``, ``x_{t+1} = x_t + eta v_t``, ``v_0 = 0``.
``beta = 0``, ``eta = 1`` is FedAvg.
"""

from __future__ import annotations

import torch

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf
from flmesh.algorithms.server_opt import ServerOptimizer
from flmesh.config import Federation, TrainingConfig
from flmesh.config.params import Param


class FedAvgMServer(ServerOptimizer):
    slots = ("v",)

    def __init__(self, momentum: float, server_lr: float):
        super().__init__()
        self.momentum, self.server_lr = momentum, server_lr

    def step(self, x: torch.Tensor, delta: torch.Tensor, slots: dict[str, torch.Tensor]) -> torch.Tensor:
        slots["v"] = self.momentum * slots["v"] + delta
        return x + self.server_lr * slots["v"]


class FedAvgM(Algorithm):
    name = "fedavgm"
    kind = "strategy"
    stale_updates = True
    params = (Param("momentum", float, 0.9, "beta, the server momentum", lo=0, hi=1, hi_open=True),
              Param("server_lr", float, 1.0, "eta, the server learning rate", lo=0, hi=10, lo_open=True))

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return self.is_strategy(federation)

    def server(self, ctx: ServerContext) -> ServerHalf:
        return FedAvgMServer(ctx.settings.momentum, ctx.settings.server_lr)
