"""Bounds on what a scheduled peer may hand a node: ``[federation] distance_guard``.

Between peers there is no aggregator to average a bad model away: the node that receives
a model continues from it. mTLS proves who sent it, not that it is honest. The guard
refuses a received model that is farther from the node's own model (the L2 distance over
every floating-point tensor) than ``distance_guard`` times the distance the node's own
model has moved from the federation's initial model M_0. Honest models of one federation
start from the same M_0 and move by similar amounts (each trains a round's steps), so an
honest model is within about twice that distance; a poisoned or boosted one is far beyond
it. The reference is the node's own training, which no peer can inflate. A refused model
is treated as one that never came: the node trains its own model, and the round's notes
say why. Before a node has trained (its model is still M_0) nothing is refused.

The guard bounds how far, not in which direction: a model within the bound may still be
poisoned. One that keeps M_0 and moves a single class's output bias by four times what an
honest model moves passes it and takes the next nodes' accuracy down
(``benchmarks/distance_guard.py``, docs/results.md). The refusal note therefore names no
distance: a refused sender who reads it (in a shared results folder or log) would learn the
scale that passes.

Pure bookkeeping over tensors; not thread-safe (the round loop calls it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

Tensors = Mapping[str, torch.Tensor]


def distance(a: Tensors, b: Tensors) -> float:
    """L2 distance between two states over their floating-point tensors (other tensors, such
    as BatchNorm's step counters, are not weights)."""
    total = 0.0
    for key, x in a.items():
        if x.is_floating_point() and key in b:
            total += float(torch.sum((x.double() - b[key].to(x.device).double()) ** 2))
    return math.sqrt(total)


class DistanceGuard:
    """``multiple`` > 0: refuse a model farther from the node's own than ``multiple`` times its
    own distance from M_0, which ``initial`` builds (called once, on the first check)."""

    def __init__(self, multiple: float, initial: Callable[[], Tensors]):
        self.multiple = multiple
        self._initial = initial
        self._m0: Tensors | None = None

    @property
    def enabled(self) -> bool:
        return self.multiple > 0

    def check(self, own: Tensors, received: Tensors, sender: str) -> str | None:
        """None to accept ``received``, or the note that refuses it."""
        if not self.enabled:
            return None
        if self._m0 is None:
            self._m0 = self._initial()
        d = distance(own, received)
        if not math.isfinite(d):
            return f"refused {sender}'s model: it holds NaN or infinity"
        moved = distance(own, self._m0)
        if moved > 0 and d > self.multiple * moved:  # no distance in the note: it would tell the scale
            return (f"refused {sender}'s model: it is farther from this node's model than distance_guard "
                    f"{self.multiple:g} times the distance this node's model moved from M_0")
        return None


__all__ = ["DistanceGuard", "distance"]
