"""fl-sim's synchronous aggregator on simulated time while nodes leave the federation: which
sampled nodes take part in each round.

A node that leaves for good (``[nodes.ID] leave_s``, a trace's ``leave``) finishes the round
under way; from the first round that opens at or after it left, it fetches, trains and sends
nothing. fl-node's aggregator still samples it (the sample comes from the seed and the round)
and waits its ``deadline_s`` for the update that never comes, then closes the round with the
others' (:func:`~flmesh.aggregator.decision.decide_round` names it missing); the replay times
such a round accordingly (:meth:`flmesh.timing.Timeline.star_round`).

A round opens when the previous one closed (a node whose last update came late begins it when
that update has arrived), so whether a node has left by round t is known once round t-1 has
been replayed (:meth:`SimulatedStar.closed`, from fl-sim's clock): the
nodes ask :meth:`~SimulatedStar.left` and the aggregator :meth:`~SimulatedStar.members`, and
both wait for that replay, so the decisions depend on the federation file alone, not on how
fast this machine runs the nodes. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from flmesh.config import Federation
from flmesh.topology.sampling import selected

#: Real seconds between two looks at a stop while waiting for a round's replay.
WAKE_S = 0.2


class SimulatedStar:
    """The rounds of a synchronous star federation that its leaving nodes sit out."""

    def __init__(self, federation: Federation):
        if federation.aggregator is None or federation.aggregator.buffered:
            raise ValueError(f"{federation.source}: no synchronous [aggregator]: no star rounds to plan")
        self.federation = federation
        self.leaves = federation.leave_times()
        self._cond = threading.Condition()
        self._opened: dict[int, float] = {1: 0.0}  # round -> when it opened (simulated s)
        self._ends: dict[str, float] = {}  # node -> when its last update arrived

    def closed(self, round: int, at: float, ends: Mapping[str, float]) -> None:
        """Round ``round`` closed at ``at`` simulated seconds, its sampled nodes' updates having
        arrived at ``ends`` (fl-sim's clock, in round order)."""
        with self._cond:
            self._ends.update(ends)
            self._opened[round + 1] = at
            self._opened.pop(round - 1, None)  # no node or aggregator asks about it again
            self._cond.notify_all()

    def _opened_at(self, round: int, stop: threading.Event) -> float | None:
        with self._cond:
            while round not in self._opened and not stop.is_set():
                self._cond.wait(WAKE_S)
            return self._opened.get(round)

    def left(self, node: str, round: int, stop: threading.Event) -> float | None:
        """When ``node`` left, if it had by the time ``round`` opened; None: it takes part (or
        ``stop`` is set). Blocks until the previous round has been replayed."""
        leave = self.leaves.get(node)
        if leave is None:
            return None
        opened = self._opened_at(round, stop)
        return leave if opened is not None and leave <= self._begins(node, opened) else None

    def members(self, round: int, stop: threading.Event) -> list[tuple[str, int]] | None:
        """The sampled nodes of ``round`` that take part, each with ``round``: the updates the
        aggregator waits for. None once ``stop`` is set."""
        opened = self._opened_at(round, stop)
        if opened is None:
            return None
        return [(n, round) for n in selected(self.federation, round)
                if self.leaves.get(n, float("inf")) > self._begins(n, opened)]

    def _begins(self, node: str, opened: float) -> float:
        """When ``node`` begins a round opened at ``opened``: once its last update has arrived."""
        with self._cond:
            return max(opened, self._ends.get(node, 0.0))

    def held(self) -> int:
        """How many rounds' opening times it holds (bounded whatever the rounds)."""
        with self._cond:
            return len(self._opened)


__all__ = ["SimulatedStar"]
