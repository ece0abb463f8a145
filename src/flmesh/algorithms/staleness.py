"""How much a late model counts: FedAsync's polynomial staleness (Xie, Koyejo and Gupta 2019,
"Asynchronous Federated Optimization", Sec. 5.2: s(t - tau) = (t - tau + 1)^-a).

A barrier-free round of neighbour averaging may combine an in-peer's model from ``s`` rounds
before the node's own. FedAsync mixes a model of staleness ``s`` into the current one with
weight ``alpha * s``; here the stale model is pulled towards the node's own model by that
weight, ``x' = x_own + (1 + s)^-a (x - x_own)``, before the ``[peers] strategy`` combines it.
For a linear strategy (D-PSGD's weights, the plain mean, FedAvg) that is the model's weight
times ``(1 + s)^-a``, the rest going to the node's own model; a robust strategy (median,
trimmed mean, Krum) sees a late model closer to the node's own. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

Tensors = dict[str, torch.Tensor]


def staleness_weight(staleness: int, exponent: float) -> float:
    """(1 + staleness)^-exponent: 1 for a model of the round itself, less the older it is."""
    if staleness < 0:
        raise ValueError(f"staleness is a number of rounds >= 0, got {staleness}")
    return float((1 + staleness) ** -exponent)


def pulled_towards(own: Mapping[str, torch.Tensor], late: Mapping[str, torch.Tensor],
                   weight: float) -> Tensors:
    """``own + weight * (late - own)`` for every floating tensor (the others, counters such as a
    BatchNorm's batches seen, are the late model's). ``weight`` 1 is ``late`` itself."""
    if weight == 1.0:
        return dict(late)
    return {k: own[k] + weight * (v - own[k]) if v.is_floating_point() else v for k, v in late.items()}


__all__ = ["pulled_towards", "staleness_weight"]
