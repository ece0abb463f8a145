"""FedBuff's buffer of updates (Nguyen et al. 2022, "Federated Learning with Buffered
Asynchronous Aggregation", Alg. 1), free of locks and transport.

With ``[aggregator] mode = "async"`` every node trains continuously: it fetches the newest
global model, trains, and submits an update tagged with the round it started from. The
aggregator keeps the updates in a buffer in arrival order; round t takes ``buffer`` (K) of
them, at most one per node (a node's older one first), and steps the global model once.

An update that started from the global model of round b reaches round t with staleness
``s = t - b``. FedBuff adds ``s(t - b) * delta`` with ``delta`` the update's change from the
model it started from, and ``s(tau) = 1 / sqrt(1 + tau)``; here the change is weighted by
:func:`~flmesh.algorithms.staleness.staleness_weight` (``(1 + s) ** -staleness_exponent``, the
paper's at 0.5) and added to the *current* global model before the strategy combines the
updates: for FedAvg with equal sample counts that is Alg. 1's step with a server learning rate
of 1, and a server optimizer (FedAvgM, FedAdam) applies its own rate to the same mean change.
An update older than ``max_staleness`` rounds is refused, and the buffer keeps the global
models of the last ``max_staleness`` + 1 rounds to measure changes against.

Not thread-safe: :class:`~flmesh.aggregator.core.AggregatorCore` calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from flmesh.algorithms.base import Tensors, Update
from flmesh.algorithms.staleness import staleness_weight
from flmesh.config import AggregatorConfig


class UpdateBuffer:
    """The updates waiting for a step of the global model, and the recent global models."""

    def __init__(self, config: AggregatorConfig):
        self.size = config.buffer
        self.max_staleness = config.max_staleness
        self.exponent = config.staleness_exponent
        self._pool: list[Update] = []  # arrival order
        self._used: set[tuple[str, int]] = set()  # (node, round) taken by an earlier step
        self._past: dict[int, Tensors] = {}  # round -> the global model it published

    # ------------------------------------------------------------------ global models
    def opened(self, round: int, global_state: Tensors) -> None:
        """Round ``round`` publishes ``global_state``: updates that start from it measure their
        change against it. Forgets what no admissible update can start from any more."""
        self._past[round] = global_state
        oldest = round - self.max_staleness
        for r in [r for r in self._past if r < oldest]:
            del self._past[r]
        self._used = {(n, r) for n, r in self._used if r >= oldest}

    def past(self) -> dict[int, Tensors]:
        """The global models kept, by the round that published them (a checkpoint's)."""
        return dict(self._past)

    # ------------------------------------------------------------------ arrivals
    def admits(self, node: str, round: int, open: int) -> str | None:
        """None when ``node``'s update that started from ``round`` may join while ``open`` is the
        newest round; else "late" (older than ``max_staleness``, or its global model is gone)
        or "duplicate" (it is here already, or an earlier step took it)."""
        if round < open - self.max_staleness or round not in self._past:
            return "late"
        if (node, round) in self._used or any(u.node == node and u.round == round for u in self._pool):
            return "duplicate"
        return None

    def add(self, update: Update) -> None:
        self._pool.append(update)

    def ready(self, round: int) -> int:
        """How many updates round ``round`` could take now (at most one per node)."""
        return len({u.node for u in self._pool if u.round >= round - self.max_staleness})

    def waiting(self) -> list[Update]:
        """Every update in the buffer, in arrival order."""
        return list(self._pool)

    def has(self, wanted: Iterable[tuple[str, int]]) -> bool:
        """Whether every (node, round) of ``wanted`` is in the buffer."""
        here = {(u.node, u.round) for u in self._pool}
        return all(w in here for w in wanted)

    # ------------------------------------------------------------------ a step
    def take(self, round: int, members: Sequence[tuple[str, int]] | None = None) -> list[Update]:
        """The updates round ``round`` steps with, removed from the buffer: ``members`` (node,
        round started from) when a plan names them (in its order), else the first ``buffer`` in
        arrival order, at most one per node. Updates too old for the next round are dropped."""
        if members is not None:  # in the plan's order: the sums do not depend on arrival here
            order = {m: i for i, m in enumerate(members)}
            taken = sorted((u for u in self._pool if (u.node, u.round) in order),
                           key=lambda u: order[(u.node, u.round)])
        else:
            taken, nodes = [], set()
            for u in self._pool:
                if len(taken) == self.size:
                    break
                if u.node not in nodes and u.round >= round - self.max_staleness:
                    taken.append(u)
                    nodes.add(u.node)
        keys = {(u.node, u.round) for u in taken}
        self._used |= keys
        oldest_next = round + 1 - self.max_staleness
        self._pool = [u for u in self._pool if (u.node, u.round) not in keys and u.round >= oldest_next]
        return taken

    def staleness(self, update: Update, round: int) -> int:
        return round - update.round

    def moved(self, update: Update, round: int, current: Tensors) -> Update:
        """``update`` as round ``round`` aggregates it: the current global model plus its change
        from the model it started from, weighted by its staleness. A fresh update is itself."""
        s = self.staleness(update, round)
        if s == 0:
            return update
        base, w = self._past[update.round], staleness_weight(s, self.exponent)
        state = {k: current[k] + w * (v - base[k]) if v.is_floating_point() else v
                 for k, v in update.state.items()}
        return replace(update, state=state)

    # ------------------------------------------------------------------ resume
    def restore(self, past: dict[int, Tensors], waiting: Sequence[Update]) -> None:
        """Take back a checkpoint's global models and the updates that were waiting."""
        self._past = dict(past)
        self._pool = [u for u in waiting if u.round in self._past]


__all__ = ["UpdateBuffer"]
