"""Coordinate-wise trimmed mean aggregation (Yin et al., ICML 2018, Sec. 3; see
:func:`flmesh.node.algorithms.robust.trimmed_mean`): per coordinate, the mean of the round's
values after dropping the ``[aggregator] trim`` share of the largest and the smallest."""

from __future__ import annotations

from collections.abc import Sequence

from flmesh.node.algorithms.base import Algorithm, ServerContext, ServerHalf, Tensors, Update
from flmesh.node.algorithms.robust import trimmed_mean
from flmesh.topology import Federation, TrainingConfig


class TrimmedMeanServer(ServerHalf):
    def __init__(self, trim: float):
        self.trim = trim

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        return trimmed_mean([u.state for u in updates], self.trim)


class TrimmedMean(Algorithm):
    name = "trimmed_mean"

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.aggregator is not None and federation.aggregator.strategy == self.name

    def server(self, ctx: ServerContext) -> ServerHalf:
        agg = ctx.federation.aggregator
        assert agg is not None, "trimmed_mean's server half runs on an aggregator"
        return TrimmedMeanServer(agg.trim)


ALGORITHM = TrimmedMean()
