"""Coordinate-wise median aggregation (Yin et al., ICML 2018, Sec. 3; see
:func:`flmesh.algorithms.robust.coordinate_median`): a strategy that one poisoned update
cannot drag, at some cost in accuracy on honest, non-IID updates."""

from __future__ import annotations

from collections.abc import Sequence

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf, Tensors, Update
from flmesh.algorithms.robust import coordinate_median
from flmesh.config import Federation, TrainingConfig


class MedianServer(ServerHalf):
    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        return coordinate_median([u.state for u in updates])


class Median(Algorithm):
    name = "median"
    kind = "strategy"
    stale_updates = True
    neighbourhood = True

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.aggregator is not None and federation.aggregator.strategy == self.name

    def server(self, ctx: ServerContext) -> ServerHalf:
        return MedianServer()
