"""FedAdam: Adam as the server optimizer.

Reddi et al., *Adaptive Federated Optimization* (ICLR 2021), Algorithm 2 (FedAdam): on the
pseudo-gradient ``Delta_t`` (:mod:`~flmesh.algorithms.server_opt`),
``m_t = beta1 m_{t-1} + (1 - beta1) Delta_t``,
``v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2``,
``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``, with ``m_0 = 0`` and ``v_0 = tau^2``
(``v_{-1} >= tau^2``), no bias correction, as in the paper.
"""

from __future__ import annotations

import torch

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf
from flmesh.algorithms.server_opt import ServerOptimizer
from flmesh.config import Federation, TrainingConfig
from flmesh.config.params import Param

#: Algorithm 2's parameters, shared with FedYogi.
ADAPTIVE = (Param("server_lr", float, 0.01, "eta, the server learning rate", lo=0, hi=10, lo_open=True),
            Param("beta1", float, 0.9, "decay of the first moment m", lo=0, hi=1, hi_open=True),
            Param("beta2", float, 0.99, "decay of the second moment v", lo=0, hi=1, hi_open=True),
            Param("tau", float, 1e-3, "the adaptivity: added to sqrt(v); v starts at tau^2", lo=0, hi=10,
                  lo_open=True))


class FedAdamServer(ServerOptimizer):
    slots = ("m", "v")

    def __init__(self, server_lr: float, beta1: float, beta2: float, tau: float):
        super().__init__()
        self.server_lr, self.beta1, self.beta2, self.tau = server_lr, beta1, beta2, tau

    def start(self, key: str, like: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"m": torch.zeros_like(like), "v": torch.full_like(like, self.tau**2)}

    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        return self.beta2 * v + (1 - self.beta2) * delta2

    def step(self, x: torch.Tensor, delta: torch.Tensor, slots: dict[str, torch.Tensor]) -> torch.Tensor:
        slots["m"] = self.beta1 * slots["m"] + (1 - self.beta1) * delta
        slots["v"] = self.second_moment(slots["v"], delta * delta)
        return x + self.server_lr * slots["m"] / (slots["v"].sqrt() + self.tau)


class FedAdam(Algorithm):
    name = "fedadam"
    kind = "strategy"
    stale_updates = True
    params = ADAPTIVE
    #: the server half built from Algorithm 2's parameters (FedYogi names its own)
    server_class: type[FedAdamServer] = FedAdamServer

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return self.is_strategy(federation)

    def server(self, ctx: ServerContext) -> ServerHalf:
        s = ctx.settings
        return self.server_class(s.server_lr, s.beta1, s.beta2, s.tau)
