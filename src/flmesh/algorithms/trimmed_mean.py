"""Coordinate-wise trimmed mean aggregation (Yin et al., ICML 2018, Sec. 3; see
:func:`flmesh.algorithms.robust.trimmed_mean`): per coordinate, the mean of the round's
values after dropping the ``[aggregator.params] trim`` share of the largest and the smallest."""

from __future__ import annotations

from collections.abc import Sequence

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf, Tensors, Update
from flmesh.algorithms.robust import trimmed_mean
from flmesh.config import Federation, TrainingConfig
from flmesh.config.params import Param


class TrimmedMeanServer(ServerHalf):
    def __init__(self, trim: float):
        self.trim = trim

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        return trimmed_mean([u.state for u in updates], self.trim)


class TrimmedMean(Algorithm):
    name = "trimmed_mean"
    kind = "strategy"
    stale_updates = True
    neighbourhood = True
    params = (Param("trim", float, 0.1, "share of the largest and of the smallest values dropped per "
                    "coordinate", lo=0, hi=0.5, hi_open=True, old="trim"),)

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.aggregator is not None and federation.aggregator.strategy == self.name

    def server(self, ctx: ServerContext) -> ServerHalf:
        return TrimmedMeanServer(ctx.settings.trim)
