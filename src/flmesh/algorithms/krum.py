"""Krum and Multi-Krum: keep the updates closest to their nearest others, drop the outliers.

Blanchard et al., *Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent*
(NeurIPS 2017). For n updates of which at most f are Byzantine, update i scores
``s(i) = sum_{j in N_i} ||V_i - V_j||^2`` over its ``n - f - 2`` nearest other updates
(Sec. 4, Def. of Krum); Krum keeps the update of least score, Multi-Krum (Sec. 5) the mean of the
``m`` least. Distances are over every floating tensor of the model. The guarantee needs
``n > 2f + 2``; with fewer updates (a small neighbourhood) each scores over its single nearest
other, which still drops a lone outlier among three or more.

As a star strategy it combines the round's updates; as a ``[peers] strategy`` the node's own
model and those of its neighbours. Updates count equally (sample counts are self-reported).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf, Tensors, Update
from flmesh.algorithms.fedavg import fedavg
from flmesh.config import Federation, TrainingConfig
from flmesh.config.params import Param


def krum_scores(states: Sequence[Tensors], f: int) -> list[float]:
    """Each state's Krum score: the sum of its squared distances to its ``max(1, n - f - 2)``
    nearest other states (float64, over the floating tensors)."""
    n = len(states)
    if n < 2:
        return [0.0] * n
    flat = torch.stack([torch.cat([t.detach().to("cpu", torch.float64).reshape(-1)
                                   for t in s.values() if t.is_floating_point()]) for s in states])
    dist = torch.cdist(flat, flat).pow(2)
    nearest = max(1, n - f - 2)
    return [float(dist[i][torch.arange(n) != i].sort().values[:nearest].sum()) for i in range(n)]


def multi_krum(states: Sequence[Tensors], f: int, m: int) -> dict[str, torch.Tensor]:
    """The mean of the ``m`` states of least Krum score (``m = 1``: Krum); ties keep the earlier."""
    if not states:
        raise ValueError("krum needs at least one state")
    scores = krum_scores(states, f)
    keep = sorted(range(len(states)), key=lambda i: (scores[i], i))[:max(1, min(m, len(states)))]
    return fedavg([states[i] for i in sorted(keep)], [1.0] * len(keep))


class KrumServer(ServerHalf):
    def __init__(self, f: int, m: int):
        self.f, self.m = f, m

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        return multi_krum([u.state for u in updates], self.f, self.m)


class Krum(Algorithm):
    name = "krum"
    kind = "strategy"
    stale_updates = True
    neighbourhood = True
    params = (Param("f", int, 1, "the most Byzantine updates among a round's (or a neighbourhood's)",
                    lo=0, hi=1024),
              Param("m", int, 1, "updates of least score averaged (1: Krum; more: Multi-Krum)",
                    lo=1, hi=1024))

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.aggregator is not None and federation.aggregator.strategy == self.name

    def server(self, ctx: ServerContext) -> ServerHalf:
        return KrumServer(ctx.settings.f, ctx.settings.m)
