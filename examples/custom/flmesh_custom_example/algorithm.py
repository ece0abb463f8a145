"""RFA: the server aggregates with the weighted geometric median instead of the mean.

Pillutla, Kakade and Harchaoui, *Robust Aggregation for Federated Learning* (IEEE Trans.
Signal Processing, 2022; arXiv:1912.13445): the next global model is the geometric median
``argmin_v sum_i alpha_i ||v - w_i||`` of the updates ``w_i`` (``alpha_i``: sample shares),
approximated by their smoothed Weiszfeld iteration, started from the weighted mean::

    beta_i = alpha_i / max(nu, ||v - w_i||)        v <- sum_i beta_i w_i / sum_i beta_i

A few iterations suffice (the paper uses 3). One update far from the others barely moves
the median, where it would drag the mean. Registered as ``rfa`` by this package's entry
point; its parameters go in ``[aggregator.params]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import flmesh

Tensors = dict[str, torch.Tensor]


def geometric_median(points: torch.Tensor, alpha: torch.Tensor, iterations: int, nu: float) -> torch.Tensor:
    """The smoothed Weiszfeld estimate of the median of ``points`` (k, d) with weights
    ``alpha`` (k,), summing to 1; float64."""
    median = alpha @ points
    for _ in range(iterations):
        distance = torch.linalg.vector_norm(points - median, dim=1).clamp_min(nu)
        beta = alpha / distance
        median = (beta / beta.sum()) @ points
    return median


class RfaServer(flmesh.ServerHalf):
    def __init__(self, iterations: int, nu: float):
        self.iterations, self.nu = iterations, nu

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[flmesh.Update]) -> Tensors:
        weights = torch.tensor([float(u.num_samples) for u in updates], dtype=torch.float64)
        alpha = weights / weights.sum() if weights.sum() > 0 else torch.full_like(weights, 1 / len(updates))
        first = updates[0].state
        floats = [k for k, v in first.items() if v.is_floating_point()]
        points = torch.stack([torch.cat([u.state[k].double().flatten() for k in floats]) for u in updates])
        median = geometric_median(points, alpha, self.iterations, self.nu)
        out = dict(first)  # non-float entries (counters): the first update's
        offset = 0
        for key in floats:
            size = first[key].numel()
            out[key] = median[offset:offset + size].view_as(first[key]).to(first[key].dtype)
            offset += size
        return out


class Rfa(flmesh.Algorithm):
    name = "rfa"
    kind = "strategy"
    params = (flmesh.Param("iterations", int, 3, "smoothed Weiszfeld iterations", lo=0, hi=100),
              flmesh.Param("nu", float, 1e-6, "the smoothing: the least distance an update counts at",
                           lo=0, lo_open=True, hi=1))

    def enabled(self, federation: flmesh.Federation, training: object) -> bool:
        return self.is_strategy(federation)

    def server(self, ctx: flmesh.ServerContext) -> flmesh.ServerHalf:
        return RfaServer(ctx.settings.iterations, ctx.settings.nu)  # [aggregator.params], checked
