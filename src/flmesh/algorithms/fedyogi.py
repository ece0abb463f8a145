"""FedYogi: Yogi as the server optimizer.

Reddi et al., *Adaptive Federated Optimization* (ICLR 2021), Algorithm 2 (FedYogi): as FedAdam
(:mod:`~flmesh.algorithms.fedadam`) but the second moment moves by at most
``(1 - beta2) Delta_t^2`` per round, towards ``Delta_t^2``:
``v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``;
``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``, ``m_0 = 0``, ``v_0 = tau^2``.
"""

from __future__ import annotations

import torch

from flmesh.algorithms.fedadam import FedAdam, FedAdamServer


class FedYogiServer(FedAdamServer):
    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.beta2) * delta2 * torch.sign(v - delta2)


class FedYogi(FedAdam):
    name = "fedyogi"
    server_class = FedYogiServer
